"""DeepSpeed's own launcher under ``accelreg run``, on a backend DeepSpeed has never heard of.

The vendor backend is the emulator under its own name, ``emu`` (a plugin of its own
distribution, ``accelreg-emu``; device type ``emu``, collectives ``emuccl``, mask variable
``ACCELREG_EMU_VISIBLE_DEVICES``), with devices of distinct sizes so a rank's capacity says
which physical device it has. The user types what DeepSpeed documents — ``deepspeed
script.py`` and its options — behind ``accelreg run --``; the script (``_launch_rank.py``) has
no accelreg line. The runner, ``deepspeed.launcher.launch`` and every rank are registry-aware
through the start-up hook:

* one rank per device of the registry's backend, masked with that backend's variable (never
  ``CUDA_VISIBLE_DEVICES``), and no "Setting accelerator to CPU" from any process;
* ``--include``/``--exclude localhost:...`` select physical devices; ``accelreg run --devices``
  (a mask the runner turns into ``--include``) too; ``DS_ACCELERATOR=emu`` is accepted;
* two nodes on localhost (``--no_ssh --node_rank``, one rank each, each node under its own
  ``accelreg run --devices``) train ZeRO-2 and end with equal weights;
* nodes started over pdsh (a stand-in ``pdsh`` that runs each node's command in a fresh
  environment, as a remote shell does) get ``ACCELREG_*`` through DeepSpeed's exports;
* a vendor backend whose driver fails (``device_count()`` raises) stops a torchrun job that
  lets DeepSpeed choose its device with accelreg's ``DeviceError`` — never DeepSpeed's cpu —
  and stops DeepSpeed's runner under ``accelreg run`` the same way.

Every job runs in its own process group, killed as a group when the test is done or fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from accelreg.testing import clean_environ

from .._fakes import make_dist
from ._harness import free_port
from .conftest import HERE

pytestmark = [pytest.mark.slow, pytest.mark.emu]

GiB = 1 << 30
RANK = str(HERE / "_launch_rank.py")
MASK = "ACCELREG_EMU_VISIBLE_DEVICES"
TIMEOUT = 400
CPU_LOG = "Setting accelerator to CPU"


def _deepspeed() -> list[str]:
    """The ``deepspeed`` command of this environment (its console script, as a user types it)."""
    script = Path(sys.executable).with_name("deepspeed")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]


def _accelreg_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelreg", "run", *args, "--"]


def node_environ(devices: int = 2, memory: str = "1GiB,2GiB", **extra: str) -> dict[str, str]:
    """A machine with ``devices`` emulated ``emu`` devices, no launcher or registry variables."""
    env = clean_environ()
    for key in [k for k in env if k.startswith("ACCELREG_EMU_")]:
        del env[key]
    env.update(
        ACCELREG_EMU_NAME="emu",
        ACCELREG_EMU_DEVICES=str(devices),
        ACCELREG_EMU_MEMORY=memory,
        OMP_NUM_THREADS="1",
        TORCHDYNAMO_DISABLE="1",
        PYTHONDONTWRITEBYTECODE="1",
        # the emulator's first use in a session builds it (a minute on a loaded machine), inside
        # a probe of whichever process comes first: the timeout is for hung drivers, not that
        ACCELREG_PROBE_TIMEOUT="900",
        **extra,
    )
    return env


@dataclass
class Job:
    """A finished job: exit status, output, and the rank records it wrote."""

    name: str
    returncode: int
    output: str
    records: list[dict[str, Any]]

    def describe(self) -> str:
        return f"[{self.name}: exit {self.returncode}]\n{self.output[-8000:]}"

    def ranks(self, n: int) -> list[dict[str, Any]]:
        if self.returncode != 0 or len(self.records) != n:
            pytest.fail(
                f"expected {n} rank records, got {len(self.records)}\n{self.describe()}", pytrace=False
            )
        return sorted(self.records, key=lambda r: r["rank"])


def run_jobs(
    jobs: dict[str, tuple[list[str], dict[str, str], Path]], timeout: float = TIMEOUT
) -> dict[str, Job]:
    """Start every job at once, each in its own process group, and wait for all. A job still
    running at ``timeout`` — and anything a finished job left behind — is killed as a group."""
    started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    done: dict[str, Job] = {}
    t0 = time.time()
    try:
        for name, (argv, env, out) in jobs.items():
            out.mkdir(parents=True, exist_ok=True)
            log = out / f"{name}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(
                    argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True
                )
            started[name] = (proc, log)
        for name, (proc, log) in started.items():
            try:
                rc = proc.wait(timeout=max(timeout - (time.time() - t0), 1))
            except subprocess.TimeoutExpired:
                rc = -9
            _kill_group(proc)
            out = jobs[name][2]
            records = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
            done[name] = Job(name, rc, log.read_text(errors="replace"), records)
    finally:
        for proc, _ in started.values():
            _kill_group(proc)
    return done


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group (start_new_session): this job only
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# -- one node -------------------------------------------------------------------------------
SINGLE_NODE = {
    # name: (accelreg run options, extra environment, devices, deepspeed options)
    "all": ((), {}, 2, ()),
    "include": ((), {}, 2, ("--include", "localhost:1")),
    "exclude-ds-accelerator": ((), {"DS_ACCELERATOR": "emu"}, 3, ("--exclude", "localhost:0")),
    "devices": (("--devices", "0,2"), {}, 3, ()),
}


@pytest.fixture(scope="module")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("ds-launch")
    jobs = {}
    for name, (run_opts, extra, devices, ds_opts) in SINGLE_NODE.items():
        out = root / name
        argv = [
            *_accelreg_run(*run_opts),
            *_deepspeed(),
            "--master_port",
            str(free_port()),
            *ds_opts,
            RANK,
            "--out",
            str(out),
        ]
        memory = ",".join(f"{i + 1}GiB" for i in range(devices))
        jobs[name] = (argv, node_environ(devices, memory, **extra), out)
    results: dict[str, Job] = {}
    names = list(jobs)
    for wave in (names[:2], names[2:]):  # two jobs at a time: the machine has two cores
        results.update(run_jobs({n: jobs[n] for n in wave}))
    return results


def _check_rank(r: dict[str, Any], physical: int, mask: str, world: int) -> None:
    local = r["local_rank"]
    assert r["world_size"] == world and r["local_rank_argument"] == local, r
    assert r["ACCELREG_RUN"] == "1" and r["integrations"]["deepspeed"] is True, r
    assert r["mask_variable"] == MASK and r["mask"] == mask and r["CUDA_VISIBLE_DEVICES"] is None, r
    assert r["accelerator"] == "RegistryAccelerator" and r["accelerator_name"] == "emu", r
    assert r["communication_backend"] == "emuccl", r
    assert r["device"] == r["resolved"] == f"emu:{local}", r
    assert r["capacity"] == (physical + 1) * GiB, (
        f"rank {r['rank']} is not on physical device {physical}: {r}"
    )


def test_one_rank_per_device_of_the_registrys_backend(single_node: dict[str, Job]) -> None:
    job = single_node["all"]
    ranks = job.ranks(2)  # no --num_gpus: the registry's device count
    for r, physical in zip(ranks, (0, 1), strict=True):
        _check_rank(r, physical, "0,1", 2)
        assert r["report"] == "handed over by accelreg (the registry chose emu)", r
    assert f"Setting {MASK}=0,1" in job.output, job.describe()  # launch.py masks with the backend's variable
    assert CPU_LOG not in job.output and "CUDA_VISIBLE_DEVICES" not in job.output, job.describe()


def test_include_selects_a_physical_device(single_node: dict[str, Job]) -> None:
    job = single_node["include"]
    (r,) = job.ranks(1)
    _check_rank(r, 1, "1", 1)
    assert CPU_LOG not in job.output, job.describe()


def test_exclude_and_ds_accelerator_naming_the_vendor_backend(single_node: dict[str, Job]) -> None:
    job = single_node["exclude-ds-accelerator"]
    ranks = job.ranks(2)
    for r, physical in zip(ranks, (1, 2), strict=True):
        _check_rank(r, physical, "1,2", 2)
        assert r["report"].startswith("handed over by accelreg (DS_ACCELERATOR=emu"), r
    assert "DS_ACCELERATOR must be one of" not in job.output, job.describe()


def test_accelreg_run_devices_reach_deepspeeds_ranks(single_node: dict[str, Job]) -> None:
    """``--devices 0,2`` masks the runner; DeepSpeed turns that mask into ``--include`` and counts
    the node's slots without it (the registry accelerator counts under the new mask)."""
    job = single_node["devices"]
    ranks = job.ranks(2)
    for r, physical in zip(ranks, (0, 2), strict=True):
        _check_rank(r, physical, "0,2", 2)
    assert "setting --include=localhost:0,2" in job.output, job.describe()


# -- two nodes --------------------------------------------------------------------------------
def test_two_nodes_no_ssh_train_zero2_and_end_equal(tmp_path: Path) -> None:
    """Two "nodes" on localhost (``--no_ssh --node_rank``), one rank each, each node under its own
    ``accelreg run --devices``: node A's rank on physical 0, node B's on physical 1 (DeepSpeed's
    slot 0 is the first device of the node's mask), ZeRO-2 over the emulator's collectives."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    out = tmp_path / "ranks"
    port = str(free_port())
    jobs = {}
    for node, device in ((0, "0"), (1, "1")):
        argv = [
            *_accelreg_run("--devices", device),
            *_deepspeed(),
            "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(node),
            "--master_addr", "127.0.0.1", "--master_port", port,
            RANK, "--out", str(out), "--train",
        ]  # fmt: skip
        jobs[f"node-{node}"] = (argv, node_environ(), out)
    done = run_jobs(jobs)
    a, b = done["node-0"], done["node-1"]
    both = Job("two nodes", a.returncode or b.returncode, f"{a.describe()}\n{b.describe()}", a.records)
    ranks = both.ranks(2)
    for r, physical in zip(ranks, (0, 1), strict=True):
        _check_rank(r, physical, str(physical), 2)
        assert r["process_group_backend"] == "emuccl", r
        t = r["train"]
        assert t["engine_device"] == "emu:0" and t["param_devices"] == ["emu:0"], t
        assert len(t["losses"]) == 3 and t["weights_changed"], t
    r0, r1 = ranks[0]["train"], ranks[1]["train"]
    assert r0["losses"] != r1["losses"]  # each rank trained on its own data ...
    assert r0["weights_sha256"] == r1["weights_sha256"]  # ... and ZeRO-2 kept the weights equal


FAKE_PDSH = '''\
#!{python}
"""pdsh stand-in: runs each node's command in a fresh environment, as a remote shell does (the
node's own variables only: its hardware, HOME, PATH), with %n replaced by the node's rank."""
import subprocess, sys
NODE = {node!r}
args = sys.argv[1:]
hosts = []
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag in ("-w", "-f"):
        value = args.pop(0)
        hosts = value.split(",") if flag == "-w" else hosts
command = " ".join(args)
procs = [subprocess.Popen(["/bin/sh", "-c", command.replace("%n", str(n))], env=NODE) for n, _ in enumerate(hosts)]
sys.exit(max(p.wait() for p in procs))
'''


def test_nodes_started_over_pdsh_are_registry_aware(tmp_path: Path) -> None:
    """DeepSpeed's runner starts the nodes of a hostfile through pdsh, exporting only the
    variables its accelerator names: accelreg's are among them, so ``launch`` and the ranks on
    the "remote" nodes (fresh environments here) are registry-aware too."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = node_environ(1, "1GiB")
    node = {k: env[k] for k in env if k.startswith("ACCELREG_EMU_") or k in ("HOME", "OMP_NUM_THREADS")}
    node.update(PATH="/usr/bin:/bin", TORCHDYNAMO_DISABLE="1")
    pdsh = bin_dir / "pdsh"
    pdsh.write_text(FAKE_PDSH.format(python=sys.executable, node=node))
    pdsh.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    out = tmp_path / "ranks"
    argv = [
        *_accelreg_run(),
        *_deepspeed(),
        "--hostfile", str(hostfile), "--no_ssh_check",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        RANK, "--out", str(out),
    ]  # fmt: skip
    job = run_jobs({"pdsh": (argv, env, out)})["pdsh"]
    assert "export ACCELREG_RUN=1" in job.output, job.describe()  # the runner's pdsh command
    ranks = job.ranks(2)
    for r in ranks:
        _check_rank(r, 0, "0", 2)
    assert job.output.count(f"Setting {MASK}=0") == 2, job.describe()  # each node's launch process
    assert CPU_LOG not in job.output, job.describe()


# -- a failing vendor driver ------------------------------------------------------------------
GCU_PLUGIN = """
from accelreg import plugin


def _count():
    raise RuntimeError("gcu driver: topsGetDeviceCount failed (error 100: no device)")


@plugin.hookimpl
def accelreg_backends():
    yield plugin.BackendSpec(
        name="gcu",
        priority=90,
        is_available=lambda: plugin.Availability.yes("driver loaded"),
        device_count=_count,
        visible_devices_var="TOPS_VISIBLE_DEVICES",
        dist_backend="eccl",
        runtime_package="acme_gcu",
    )
"""

TRAIN_LETTING_DEEPSPEED_CHOOSE = """
import accelreg
accelreg.install()
import deepspeed, torch
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
print("TRAINED ON", engine.device, flush=True)
"""


@pytest.fixture
def failing_vendor(tmp_path: Path) -> dict[str, str]:
    """A machine whose vendor accelerator (a ``gcu`` plugin, as docs/plugins.md has a vendor
    write it) is installed but whose driver fails: its ``device_count()`` raises."""
    site = make_dist(tmp_path / "site", "acme-gcu", "1.0", "acme_gcu", GCU_PLUGIN, "gcu")
    env = clean_environ()
    for key in [k for k in env if k.startswith("ACCELREG_EMU_")]:
        del env[key]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p),
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def test_torchrun_with_a_failing_driver_stops_with_a_device_error(
    tmp_path: Path, failing_vendor: dict[str, str]
) -> None:
    """The issue's scenario: torchrun, ``accelreg.install()``, DeepSpeed choosing its device, the
    vendor's driver failing. DeepSpeed must not get its cpu accelerator (it would train on the
    cpu over gloo and exit 0): the job stops with accelreg's DeviceError."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_LETTING_DEEPSPEED_CHOOSE)
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script),
    ]  # fmt: skip
    job = run_jobs({"torchrun": (argv, failing_vendor, tmp_path / "job")})["torchrun"]
    assert job.returncode != 0 and "TRAINED ON" not in job.output, job.describe()
    assert "accelreg.errors.DeviceError: DeepSpeed needs its accelerator" in job.output, job.describe()
    assert "topsGetDeviceCount failed" in job.output and "LOCAL_RANK=0" in job.output, job.describe()
    assert CPU_LOG not in job.output, job.describe()


def test_deepspeeds_runner_with_a_failing_driver_stops_with_a_device_error(
    tmp_path: Path, failing_vendor: dict[str, str]
) -> None:
    out = tmp_path / "job"
    argv = [*_accelreg_run(), *_deepspeed(), "--master_port", str(free_port()), RANK, "--out", str(out)]
    job = run_jobs({"runner": (argv, failing_vendor, out)})["runner"]
    assert job.returncode != 0 and not job.records, job.describe()
    assert "accelreg.errors.DeviceError" in job.output and "ACCELREG_RUN=1" in job.output, job.describe()
    assert "deepspeed.launcher.launch" not in job.output and CPU_LOG not in job.output, job.describe()
