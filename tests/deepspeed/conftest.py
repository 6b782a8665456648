"""The DeepSpeed group: real DeepSpeed, transformers, peft and bitsandbytes in subprocesses.

Importing them takes ~10 s per fresh interpreter on two cores, so each helper process runs
many configurations (``_run.py``) and every configuration becomes its own test. A process is
started by the first test that needs it and its results are shared by the others:

========== ======================================================================== =======
process    configurations                                                           accelreg
========== ======================================================================== =======
none       Trainer control without DeepSpeed; seed 000 on ZeRO 0-3 (the canary);    never
           two upstream engine round trips                                          imported
install    Trainer control without DeepSpeed; seed 000 on ZeRO 0-3                  install()
deepspeed  seed 000 on ZeRO 0-3; engine round trip bits {8,4} x ZeRO {0,1,2,3} x    DeepSpeed
           exclude_frozen x strict (32 cases)                                       integration
accelerator DeepSpeed accelerator agreement checks (``_accel_checks.py``)            imported
========== ======================================================================== =======

Each process gets a clean environment (``accelreg.testing.clean_environ``; no emulator), the
single-process launcher variables (``RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR`` and a free
``MASTER_PORT``; the control run drops them before its Trainer is built, or Trainer would wrap
the model in DDP), and ``OMP_NUM_THREADS=1`` (with two OpenMP threads on a shared two-core
machine, a 64x64 matmul takes 15 ms instead of 0.02 ms: the threads spin-wait on each other).

Emulated runs (``Helpers.zero``, ``two_nodes``, ``seed_device``) get the emulator instead:
``_zero.py`` under torchrun (or alone, for one rank) on ``musa`` and ``emu`` — backends DeepSpeed
has no class for — with 1 and 2 ranks; two torchrun agents joined by a c10d rendezvous as two
nodes; seed 000 on the emulated ``npu`` device. Runs that fit are started together (at most two
busy interpreters: the machine has two cores). They also get ``TORCHDYNAMO_DISABLE=1``:
bitsandbytes' device-independent kernels try ``torch.compile``, which fails on a PrivateUse1
device and is retried on every call (minutes per Trainer run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from accelreg.testing import clean_environ

from ._harness import DS_ENV, free_port  # DS_ENV: launcher variables of a one-process run

HERE = Path(__file__).resolve().parent
RESULT = "@@RESULT@@ "
STAGES = (0, 1, 2, 3)
ROUND_TRIPS = [(b, s, ef, st) for b in (8, 4) for s in STAGES for ef in (1, 0) for st in (1, 0)]
UPSTREAM_ROUND_TRIPS = [(8, 0, 0, 0), (4, 0, 0, 0)]
TIMEOUT = 420

PLANS: dict[str, list[str]] = {
    "none": [
        "--trainer",
        "control",
        *map(str, STAGES),
        "--roundtrip",
        *(":".join(map(str, c)) for c in UPSTREAM_ROUND_TRIPS),
    ],
    "install": ["--trainer", "control", *map(str, STAGES)],
    "deepspeed": [
        "--trainer",
        *map(str, STAGES),
        "--roundtrip",
        *(":".join(map(str, c)) for c in ROUND_TRIPS),
    ],
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multinode: several torchrun agents on localhost joined by a rendezvous as separate nodes "
        "(CI runs them; -m 'not multinode' skips them)",
    )


def helper_environ(work: Path) -> dict[str, str]:
    env = clean_environ()
    for key in [k for k in env if k.startswith("ACCELREG_EMU_") and k != "ACCELREG_EMU_CACHE"]:
        del env[key]  # never the emulator here, even inside an emulator child (its build cache stays)
    env.update(DS_ENV)
    env.update(
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_OFFLINE="1",
        XDG_CONFIG_HOME=str(work / "xdg"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def emu_helper_environ(
    work: Path, name: str, *, launcher: bool, devices: int = 2, memory: str | None = None
) -> dict[str, str]:
    """:func:`helper_environ` with the emulator as ``name``; ``launcher``: torchrun sets the
    rank variables itself (the one-rank runs get DeepSpeed's single-process set)."""
    env = helper_environ(work)
    if launcher:
        for key in (*DS_ENV, "MASTER_PORT"):
            env.pop(key, None)
    env.update(ACCELREG_EMU_NAME=name, ACCELREG_EMU_DEVICES=str(devices), TORCHDYNAMO_DISABLE="1")
    if memory is not None:
        env["ACCELREG_EMU_MEMORY"] = memory
    return env


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@dataclass
class Run:
    """One helper process: its result records, exit status, wall time and output tail."""

    name: str
    records: list[dict[str, Any]]
    returncode: int
    wall: float
    output: str
    timings: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        return f"[{self.name} process: exit {self.returncode}, {self.wall:.1f} s]\n{self.output}"

    def done(self) -> dict[str, Any]:
        last = [r for r in self.records if r.get("kind") == "done"]
        if not last or self.returncode != 0:
            pytest.fail(f"the helper process did not finish\n{self.describe()}", pytrace=False)
        return last[0]

    def ranks(self, n: int) -> list[dict[str, Any]]:
        """The ``n`` rank records of a launch, in rank order (fails when the launch failed)."""
        if self.returncode != 0 or len(self.records) != n:
            pytest.fail(
                f"expected {n} rank results, got {len(self.records)}\n{self.describe()}", pytrace=False
            )
        return sorted(self.records, key=lambda r: r["rank"])

    def find(self, kind: str, args: list[int]) -> dict[str, Any]:
        for record in self.records:
            if record.get("kind") == kind and record.get("args") == list(args):
                if record.get("harness_error"):
                    pytest.fail(
                        f"{kind} {args}: the harness failed: {record.get('exc_type')}: {record.get('exc')}\n"
                        + "\n".join(record.get("frames", [])),
                        pytrace=False,
                    )
                return record
        pytest.fail(f"{kind} {args}: no result\n{self.describe()}", pytrace=False)


class Helpers:
    """Starts each helper process once per session, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = root / "tiny_llama"
        self.runs: dict[str, Run] = {}

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Run:
        env = env if env is not None else helper_environ(self.root)
        t0 = time.time()
        try:
            proc = subprocess.run(
                [sys.executable, *argv],
                capture_output=True,
                text=True,
                env=env,
                cwd=self.root,
                timeout=TIMEOUT,
            )
            out, rc = proc.stdout, proc.returncode
            err = proc.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc = -9
        wall = time.time() - t0
        records = [json.loads(line[len(RESULT) :]) for line in out.splitlines() if line.startswith(RESULT)]
        tail = "\n".join(line for line in out.splitlines() if not line.startswith(RESULT))[-3000:]
        run = Run(name, records, rc, wall, f"--- stdout ---\n{tail}\n--- stderr ---\n{err[-6000:]}")
        for record in records:
            if record.get("kind") == "setup":
                run.timings["import"] = record["t_import"]
        self.runs[name] = run
        return run

    def run(self, mode: str) -> Run:
        if mode not in self.runs:
            self._start(
                mode,
                [
                    str(HERE / "_run.py"),
                    "--accelreg",
                    mode,
                    "--model",
                    str(self.model),
                    "--out",
                    str(self.root / mode),
                    *PLANS[mode],
                ],
            )
        return self.runs[mode]

    def _together(self, jobs: dict[str, tuple[list[str], dict[str, str], Path]]) -> None:
        """Start every job at once and wait for all; each becomes ``self.runs[name]``, whose
        records are the rank files its job wrote to its folder."""
        t0 = time.time()
        procs = {}
        for name, (argv, env, out) in jobs.items():
            out.mkdir(parents=True, exist_ok=True)
            procs[name] = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=self.root
            )
        for name, proc in procs.items():
            try:
                text, _ = proc.communicate(timeout=max(TIMEOUT - (time.time() - t0), 1))
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
            records = [json.loads(f.read_text()) for f in sorted(jobs[name][2].glob("rank*.json"))]
            self.runs[name] = Run(name, records, proc.returncode, time.time() - t0, (text or "")[-6000:])

    def _zero_job(self, name: str, nproc: int) -> tuple[list[str], dict[str, str], Path]:
        out = self.root / f"zero-{name}-{nproc}"
        args = [str(HERE / "_zero.py"), "--out", str(out)]
        if nproc == 1:  # one rank needs no launcher: DeepSpeed's single-process variables
            return [sys.executable, *args], emu_helper_environ(self.root, name, launcher=False), out
        port = str(free_port())
        argv = torchrun(
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", port, *args
        )
        return argv, emu_helper_environ(self.root, name, launcher=True), out

    def zero(self, name: str, nproc: int) -> Run:
        """``_zero.py`` with ``nproc`` ranks on the emulated ``name`` (musa or emu). Every
        combination runs on first use, at most two busy interpreters at a time."""
        key = f"zero-{name}-{nproc}"
        if key not in self.runs:
            wanted = _ZERO_SELECTED | {(name, nproc)} if _ZERO_SELECTED else None
            for wave in ([("musa", 1), ("emu", 1)], [("musa", 2)], [("emu", 2)]):
                jobs = {
                    f"zero-{n}-{k}": (n, k)
                    for n, k in wave
                    if (wanted is None or (n, k) in wanted) and f"zero-{n}-{k}" not in self.runs
                }
                if jobs:
                    self._together({job: self._zero_job(*args) for job, args in jobs.items()})
        return self.runs[key]

    def two_nodes(self) -> Run:
        """Two torchrun agents (``--nnodes 2``, c10d rendezvous on localhost), 2 ranks each, on an
        emulated npu machine with 4 devices of distinct sizes; node A sees physical 0,1 and node B
        2,3 through ``ASCEND_RT_VISIBLE_DEVICES``. One run; its records are all four ranks'."""
        if "two-nodes" not in self.runs:
            out = self.root / "two-nodes"
            endpoint = f"127.0.0.1:{free_port()}"
            jobs = {}
            for node, mask in (("node-a", "0,1"), ("node-b", "2,3")):
                env = emu_helper_environ(
                    self.root, "npu", launcher=True, devices=4, memory="1GiB,2GiB,3GiB,4GiB"
                )
                env["ASCEND_RT_VISIBLE_DEVICES"] = mask
                argv = torchrun(
                    "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", endpoint, "--rdzv-id", "accelreg-two-nodes",
                    str(HERE / "_zero.py"), "--out", str(out), "--stages",
                )  # fmt: skip
                jobs[node] = (argv, env, out)
            self._together(jobs)
            a, b = self.runs.pop("node-a"), self.runs.pop("node-b")
            records = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]  # both nodes'
            output = f"--- node a (exit {a.returncode}) ---\n{a.output}\n--- node b (exit {b.returncode}) ---\n{b.output}"
            self.runs["two-nodes"] = Run(
                "two-nodes", records, a.returncode or b.returncode, max(a.wall, b.wall), output
            )
        return self.runs["two-nodes"]

    def seed_device(self) -> Run:
        """Seed 000 on the emulated npu device (``_seed_device.py``): the 8-bit refusal, then the
        4-bit seed on ZeRO-2 and ZeRO-3."""
        if "seed-npu" not in self.runs:
            env = emu_helper_environ(self.root, "npu", launcher=False)
            argv = [
                str(HERE / "_seed_device.py"),
                "--model",
                str(self.model),
                "--out",
                str(self.root / "seed-npu"),
            ]
            self._start("seed-npu", [*argv, "--stages", "2", "3"], env=env)
        return self.runs["seed-npu"]

    def accelerator(self) -> Run:
        if "accelerator" not in self.runs:
            self._start("accelerator", [str(HERE / "_accel_checks.py")])
        return self.runs["accelerator"]


_HELPERS: list[Helpers] = []
#: The (backend, ranks) combinations the selected test_zero.py tests read (empty: all of them), so
#: that a ``-k`` subset (the release matrix runs one backend) starts only the runs it checks.
_ZERO_SELECTED: set[tuple[str, int]] = set()


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path.name == "test_zero.py" and "name" in params:
            _ZERO_SELECTED.add((params["name"], params.get("nproc", 2)))  # collectives: 2 ranks


@pytest.fixture(scope="session")
def ds_helpers(tmp_path_factory: pytest.TempPathFactory) -> Helpers:
    helpers = Helpers(tmp_path_factory.mktemp("deepspeed"))
    _HELPERS.append(helpers)
    return helpers


def _summary() -> list[str]:
    runs = [run for helpers in _HELPERS for run in helpers.runs.values()]
    if not runs:
        return []
    lines = []
    for run in runs:
        configs = [r for r in run.records if "t_config" in r or "t_case" in r]
        per = ", ".join(
            f"{r.get('kind')} {r.get('args')}: {r.get('t_config', r.get('t_case'))} s" for r in configs[:6]
        )
        more = f" (+{len(configs) - 6} more)" if len(configs) > 6 else ""
        lines.append(
            f"{run.name}: {run.wall:.1f} s wall, imports {run.timings.get('import', '?')} s, "
            f"{len(configs)} configurations; {per}{more}"
        )
    where = f" ({os.environ['PYTEST_XDIST_WORKER']})" if os.environ.get("PYTEST_XDIST_WORKER") else ""
    lines.append(f"total: {sum(r.wall for r in runs):.1f} s in {len(runs)} processes{where}")
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and (lines := _summary()):  # a pytest-xdist worker: the
        # controller writes the summary (tests/conftest.py)
        workeroutput.setdefault("accelreg_summary", {})["DeepSpeed helper processes"] = lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if lines := _summary():
        terminalreporter.section("DeepSpeed helper processes")
        for line in lines:
            terminalreporter.write_line(line)
