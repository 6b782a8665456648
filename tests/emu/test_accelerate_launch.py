"""``accelerate launch`` on the emulated accelerator, under names accelerate knows (npu, mlu) and
one it has never heard of (``emu``: the emulator's own plugin, a vendor distribution of its own
written as docs/plugins.md says, device type ``emu``, collectives ``emuccl``, mask variable
``ACCELREG_EMU_VISIBLE_DEVICES``).

The script (``_accelerate_train.py``) is a plain ``Accelerator()`` loop with no accelreg line
(``--install`` adds ``accelreg.install()`` for the run without ``accelreg run``). Every rank
records its distributed type, device, process group, an ``all_reduce`` of ones, ``gather``,
``reduce``, a ``save_state``/``load_state`` round trip, the dtype of its first matmul under
``--mixed_precision bf16``, its masks, and the trained parameters, which must equal those of
the same script run as two cpu processes (torchrun, ``ACCELERATE_USE_CPU``).

The jobs run at once, each in its own process group, killed as a group when done.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from accelreg.testing import clean_environ, emu_environ

from ..deepspeed._harness import free_port
from ..deepspeed.test_launcher import Job, run_jobs

#: Every test but the in-process one shares the module's jobs (launchers, two interpreters each):
#: slow. The in-process check of the never-silently-cpu rule stays in the default run.
pytestmark = pytest.mark.emu

pytest.importorskip("accelerate", reason="accelerate is in the [accelerate] extra")

TRAIN = str(Path(__file__).with_name("_accelerate_train.py"))
TIMEOUT = 500


def _accelerate(*args: str) -> list[str]:
    """The ``accelerate`` command of this environment (its console script, as a user types it)."""
    script = Path(sys.executable).with_name("accelerate")
    base = [str(script)] if script.is_file() else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
    return [*base, *args]


def _run(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelreg", "run", *args, "--"]


def _environ(name: str | None, work: Path, **extra: str) -> dict[str, str]:
    """A machine with the emulator as ``name`` x 2 (``None``: no emulator), no accelerate config."""
    env = emu_environ(name, 2) if name is not None else clean_environ()
    if name is None:
        for key in [k for k in env if k.startswith("ACCELREG_EMU_") and k != "ACCELREG_EMU_CACHE"]:
            del env[key]
    env.update(
        HF_HOME=str(work / "hf"),  # no default accelerate config file
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
        ACCELREG_PROBE_TIMEOUT="900",  # a loaded machine: the timeout is for hung drivers
        **extra,
    )
    return env


def _launch(*args: str) -> list[str]:
    return _accelerate("launch", "--main_process_port", str(free_port()), *args)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("accelerate-launch")
    bf16 = ("--mixed_precision", "bf16")
    cfg = root / "npu-config" / "config.yaml"
    port = str(free_port())
    machine = ("--num_machines", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", port)
    machines = root / "machines"
    spec: dict[str, tuple[list[str], dict[str, str], Path]] = {}

    def job(name: str, argv: list[str], env: dict[str, str]) -> None:
        spec[name] = (argv, env, root / name)  # its log and rank records go there

    # a vendor-only name: the launcher counts the registry's devices (no --num_processes)
    job("emu", [*_run(), *_launch(*bf16), TRAIN, str(root / "emu")], _environ("emu", root))
    # the same script with accelreg.install() in it, under the stock launcher (no accelreg run)
    job(
        "emu-install",
        [
            *_launch("--multi_gpu", "--num_processes", "2", *bf16),
            TRAIN,
            str(root / "emu-install"),
            "--install",
        ],
        _environ("emu", root),
    )
    # npu with the config file `accelerate config default` writes
    config = [*_run(), *_accelerate("config", "default", "--config_file", str(cfg), *bf16)]
    launch = [*_run(), *_launch("--config_file", str(cfg)), TRAIN, str(root / "npu-config")]
    job("npu-config", ["/bin/sh", "-c", " ".join(config) + " && " + " ".join(launch)], _environ("npu", root))
    job(
        "mlu",
        [*_run(), *_launch("--num_processes", "2", *bf16), TRAIN, str(root / "mlu")],
        _environ("mlu", root),
    )
    # two machines on localhost, one process each, machine r on physical device r
    for r in (0, 1):
        argv = _accelerate(
            "launch", *machine, "--machine_rank", str(r), "--num_processes", "2", "--multi_gpu"
        )
        argv += ["--gpu_ids", str(r), *bf16, TRAIN, str(machines)]
        job(f"machine{r}", [*_run(), *argv], _environ("emu", root))
    # one device, chosen by accelerate's --gpu_ids and by accelreg run --devices
    job("gpu-ids", [*_run(), *_launch("--gpu_ids", "1"), TRAIN, str(root / "gpu-ids")], _environ("emu", root))
    job("devices", [*_run("--devices", "1"), *_launch(), TRAIN, str(root / "devices")], _environ("emu", root))
    # npu disabled in accelreg: accelerate 1.10-1.15's ladder finds torch_npu, 1.16 torch.accelerator
    job(
        "disabled",
        [*_run(), *_launch("--multi_gpu", "--num_processes", "2", *bf16), TRAIN, str(root / "disabled")],
        _environ("npu", root, ACCELREG_DISABLE="npu"),
    )
    job("env", [*_run(), *_accelerate("env")], _environ("emu", root))
    # the reference: the same script as two cpu processes
    reference = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    reference += ["--master-port", str(free_port()), TRAIN, str(root / "cpu")]
    job("cpu", reference, _environ(None, root, ACCELERATE_USE_CPU="true", ACCELERATE_MIXED_PRECISION="bf16"))
    machines.mkdir()
    done = run_jobs(spec, timeout=TIMEOUT)
    for name in ("machine0", "machine1"):  # both machines write their rank into one folder
        done[name].records = [json.loads(f.read_text()) for f in sorted(machines.glob("rank*.json"))]
    CONFIG["npu"] = json.loads(cfg.read_text()) if cfg.exists() else {}
    return done


#: The config file ``accelerate config default`` wrote under npu.
CONFIG: dict[str, Any] = {}


def _cpu_params(jobs: dict[str, Job]) -> list[Any]:
    ranks = jobs["cpu"].ranks(2)
    assert ranks[0]["distributed_type"] == "MULTI_CPU" and ranks[0]["all_reduce"] == 2.0, ranks[0]
    return ranks[0]["params"]


def _trained(rank: dict[str, Any], jobs: dict[str, Job], name: str, r: int) -> None:
    """Rank ``r`` of a two-process job trained on ``name:r`` as a multi-process rank of the
    registry's backend: collectives, checkpoints, bf16 autocast and the cpu's parameters."""
    assert rank["device"] == f"{name}:{r}" and rank["param_devices"] == [f"{name}:{r}"], rank
    assert rank["processes"] == 2 and rank["local_rank"] == r, rank
    assert rank["all_reduce"] == 2.0 and rank["gather"] == [0, 1] and rank["reduce"] == 2.0, rank
    assert rank["restored"] and rank["matmul"] == "torch.bfloat16" and rank["accelerator"] == name, rank
    assert rank["params"] == _cpu_params(jobs), "the parameters differ from the 2-process cpu run"


@pytest.mark.slow
def test_a_vendor_only_backend_gets_one_rank_per_device_counted_by_the_registry(jobs):
    ranks = jobs["emu"].ranks(2)
    for r, rank in enumerate(ranks):
        _trained(rank, jobs, "emu", r)
        assert rank["distributed_type"] == "MULTI_GPU" and rank["process_group"] == "emuccl", rank
        assert rank["masks"] == {} and rank["emulated_visible"] == [0, 1], rank


@pytest.mark.slow
def test_install_in_the_script_under_the_stock_launcher(jobs):
    for r, rank in enumerate(jobs["emu-install"].ranks(2)):
        _trained(rank, jobs, "emu", r)
        assert rank["distributed_type"] == "MULTI_GPU" and rank["process_group"] == "emuccl", rank


@pytest.mark.slow
def test_npu_with_the_config_file_accelerate_config_default_writes(jobs):
    ranks = jobs["npu-config"].ranks(2)
    config = CONFIG["npu"]
    assert config["num_processes"] == 2 and config["distributed_type"] == "MULTI_NPU", config
    assert config["use_cpu"] is False and config["mixed_precision"] == "bf16", config
    for r, rank in enumerate(ranks):
        _trained(rank, jobs, "npu", r)
        assert rank["distributed_type"] == "MULTI_NPU" and rank["process_group"] == "hccl", rank


@pytest.mark.slow
def test_mlu_with_an_explicit_process_count(jobs):
    for r, rank in enumerate(jobs["mlu"].ranks(2)):
        _trained(rank, jobs, "mlu", r)
        assert rank["distributed_type"] == "MULTI_MLU" and rank["process_group"] == "cncl", rank


@pytest.mark.slow
def test_two_machines_on_localhost_each_on_its_own_device(jobs):
    for name in ("machine0", "machine1"):
        assert jobs[name].returncode == 0, jobs[name].describe()
    ranks = sorted(jobs["machine0"].records, key=lambda x: x["rank"])
    assert len(ranks) == 2, jobs["machine0"].describe() + jobs["machine1"].describe()
    for r, rank in enumerate(ranks):
        assert rank["device"] == "emu:0" and rank["local_rank"] == 0 and rank["processes"] == 2, rank
        assert rank["masks"] == {"ACCELREG_EMU_VISIBLE_DEVICES": str(r)} and rank["emulated_visible"] == [
            r
        ], rank
        assert rank["all_reduce"] == 2.0 and rank["gather"] == [0, 1] and rank["restored"], rank
        assert rank["process_group"] == "emuccl" and rank["params"] == _cpu_params(jobs), rank


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpu-ids", "devices"])
def test_one_device_lands_on_physical_device_1(jobs, name):
    """``--gpu_ids 1`` masks the backend's own variable (accelerate 1.10-1.15 would set
    ``CUDA_VISIBLE_DEVICES`` for a type it does not list, 1.16 nothing); ``accelreg run
    --devices 1`` masks it for the whole job. One process, on physical device 1."""
    (rank,) = jobs[name].ranks(1)
    assert rank["masks"] == {"ACCELREG_EMU_VISIBLE_DEVICES": "1"} and rank["emulated_visible"] == [1], rank
    assert rank["device"] in ("emu", "emu:0") and rank["param_devices"] == ["emu:0"], rank
    assert rank["processes"] == 1 and rank["restored"], rank


@pytest.mark.slow
def test_a_backend_disabled_in_accelreg_is_never_used_by_a_rank(jobs):
    """ACCELREG_DISABLE=npu: accelerate's own detection still finds the (emulated) npu runtime;
    every rank runs on the cpu as accelerate's cpu ranks do, and torch.accelerator says none."""
    for rank in jobs["disabled"].ranks(2):
        assert rank["device"].startswith("cpu") and rank["param_devices"] == ["cpu"], rank
        assert rank["distributed_type"] == "MULTI_CPU" and rank["process_group"] == "gloo", rank
        assert rank["accelerator"] == "None" and rank["params"] == _cpu_params(jobs), rank


@pytest.mark.slow
def test_accelerate_env_shows_the_registry_backend(jobs):
    job = jobs["env"]
    assert job.returncode == 0, job.describe()
    assert "- accelreg registry backend: emu (emu:0, emu:1; collectives emuccl)" in job.output, job.describe()


@pytest.mark.accelreg_emu(name="emu", devices=2)
def test_a_launched_rank_that_accelerate_puts_on_the_cpu_is_a_device_error(monkeypatch):
    """Never silently cpu: where accelerate itself decides the cpu for a launched rank (its own
    type detection, say a release whose ``_prepare_backend`` seam is skipped) while the
    registry has an available accelerator, the ``set_device`` seam raises, naming the call;
    a rank that asked for the cpu gets it."""
    from types import SimpleNamespace

    import accelerate.state as state

    import accelreg
    from accelreg.integrations import accelerate as ar_accelerate

    for key, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    accelreg.reset()
    ar_accelerate.enable()
    try:
        kinds = state.DistributedType
        rank = SimpleNamespace(
            device=None, distributed_type=kinds.MULTI_CPU, _cpu=False, local_process_index=0
        )
        with pytest.raises(accelreg.DeviceError) as info:
            state.PartialState.set_device(rank)
        message = str(info.value)
        assert "accelerate.PartialState.set_device() put this process on the cpu" in message, message
        assert "emu is available here (emu:0, emu:1)" in message and "LOCAL_RANK=0" in message, message
        asked = SimpleNamespace(
            device=None, distributed_type=kinds.MULTI_CPU, _cpu=True, local_process_index=0
        )
        state.PartialState.set_device(asked)
        assert asked.device.type == "cpu"
    finally:
        ar_accelerate.disable()


@pytest.mark.accelreg_emu(name="emu", devices=2)
def test_accelerate_use_cpu_is_read_as_accelerate_reads_it(monkeypatch):
    """``ACCELERATE_USE_CPU`` asks for the cpu wherever accelerate's own
    ``parse_flag_from_env`` says so (``t``, ``y``, ``True``: accelerate's words, not accelreg's),
    and only there: an off word, or a value accelerate refuses, leaves the never-silently-cpu
    check to raise."""
    from types import SimpleNamespace

    import accelerate.state as state
    from accelerate.utils.environment import parse_flag_from_env

    import accelreg
    from accelreg.integrations import accelerate as ar_accelerate

    for key, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    accelreg.reset()
    ar_accelerate.enable()
    try:
        for value, asked in {
            "t": True,
            "y": True,
            "True": True,
            "1": True,
            "f": False,
            "off": False,
            "maybe": False,
        }.items():
            monkeypatch.setenv("ACCELERATE_USE_CPU", value)
            if value != "maybe":
                assert parse_flag_from_env("ACCELERATE_USE_CPU") is asked, value
            rank = SimpleNamespace(
                device=None,
                distributed_type=state.DistributedType.MULTI_CPU,
                _cpu=False,
                local_process_index=0,
            )
            if asked:
                state.PartialState.set_device(rank)
                assert rank.device.type == "cpu", value
            else:
                with pytest.raises(accelreg.DeviceError, match="put this process on the cpu"):
                    state.PartialState.set_device(rank)
    finally:
        ar_accelerate.disable()
