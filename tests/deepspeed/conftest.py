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
"""

from __future__ import annotations

import json
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


def helper_environ(work: Path) -> dict[str, str]:
    env = clean_environ()
    for key in [k for k in env if k.startswith("ACCELREG_EMU_")]:
        del env[key]  # never the emulator here, even inside an emulator child
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

    def _start(self, name: str, argv: list[str]) -> Run:
        env = helper_environ(self.root)
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

    def accelerator(self) -> Run:
        if "accelerator" not in self.runs:
            self._start("accelerator", [str(HERE / "_accel_checks.py")])
        return self.runs["accelerator"]


_HELPERS: list[Helpers] = []


@pytest.fixture(scope="session")
def ds_helpers(tmp_path_factory: pytest.TempPathFactory) -> Helpers:
    helpers = Helpers(tmp_path_factory.mktemp("deepspeed"))
    _HELPERS.append(helpers)
    return helpers


def pytest_terminal_summary(terminalreporter: Any) -> None:
    runs = [run for helpers in _HELPERS for run in helpers.runs.values()]
    if not runs:
        return
    terminalreporter.section("DeepSpeed helper processes")
    for run in runs:
        configs = [r for r in run.records if "t_config" in r or "t_case" in r]
        per = ", ".join(
            f"{r.get('kind')} {r.get('args')}: {r.get('t_config', r.get('t_case'))} s" for r in configs[:6]
        )
        more = f" (+{len(configs) - 6} more)" if len(configs) > 6 else ""
        terminalreporter.write_line(
            f"{run.name}: {run.wall:.1f} s wall, imports {run.timings.get('import', '?')} s, "
            f"{len(configs)} configurations; {per}{more}"
        )
    terminalreporter.write_line(f"total: {sum(r.wall for r in runs):.1f} s in {len(runs)} processes")
