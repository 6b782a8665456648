"""accelerate under ``accelreg run`` against stock accelerate (issue 28), on the emulated npu
(a backend accelerate knows, so the stock arm runs on the device too).

    python benchmarks/bench_accelerate.py --rounds 20 --step-rounds 5

* **Rank start-up** (goal: <= +30 ms): one rank as ``accelerate launch`` starts it (``LOCAL_RANK``,
  ``RANK``, ``WORLD_SIZE=1``, ``MASTER_ADDR``/``MASTER_PORT``), in a fresh interpreter that
  imports accelerate and builds ``Accelerator()`` (its process group included), then exits.
  ``stock``: accelerate alone; ``accelreg run``: the same process with ``ACCELREG_RUN=1``, as
  every process of an ``accelreg run -- accelerate launch`` job runs (the start-up hook, then
  ``install()`` at ``import accelerate``: the registry, its probes, the seams). Wall time of each
  process from the parent, the arms alternating (the order rotates every round); the added cost
  is the median of the paired differences.
* **Training step** (goal: <= 1.02x): a rank process (``accelreg.install()`` before accelerate is
  imported) prepares a small MLP with ``Accelerator()`` on ``npu:0``, then times blocks of
  ``--steps`` steps (zero_grad, forward, ``backward``, ``step``), the arms alternating block by
  block on the one prepared model: ``stock`` after ``accelreg.integrations.uninstall()`` (every
  seam back to the library's own function), ``install()`` after ``accelreg.install()`` again.
  Each block's median step in wall time and in process CPU time (all threads: the emulated
  device's autograd worker too); per process, each arm's median block and their ratio; the
  figure is the median over ``--step-rounds`` processes. Processes differ from each other by
  more than 2 % (memory layout, the machine's load), so the arms share one.

The machine is shared: the load average is printed with the figures. Bytecode is written and
read as in an installation (``PYTHONDONTWRITEBYTECODE`` is dropped from the children's
environment; the first, untimed round writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

START_GOAL_MS = 30.0
STEP_GOAL = 1.02

RANK = """
import accelerate
from accelerate import Accelerator

accelerator = Accelerator()
assert accelerator.device.type == "npu", accelerator.device
"""

STEP = """
import json, statistics, sys, time
import accelreg
from accelreg import integrations

accelreg.install()
import torch
from accelerate import Accelerator

steps, blocks = int(sys.argv[1]), int(sys.argv[2])
accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
x = torch.randn(64, 256, device=accelerator.device)
y = torch.randn(64, 256, device=accelerator.device)
assert accelerator.device.type == "npu", accelerator.device


def block(n):
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1000, statistics.median(cpu) * 1000


def arm(name):
    if name == "stock":
        integrations.uninstall()  # every seam back to accelerate's and torch's own functions
    else:
        accelreg.install()  # the libraries are imported: every integration is enabled now


out = {"stock": [], "install()": []}
for name in out:  # warm-up, both arms
    arm(name)
    block(20)
for b in range(blocks):
    for name in (["stock", "install()"] if b % 2 == 0 else ["install()", "stock"]):
        arm(name)
        out[name].append(block(steps))
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environ(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELREG_", "LOCAL_RANK", "RANK", "WORLD_SIZE"))
        # bytecode is written and read as in a user's installation (the libraries' wheels ship
        # theirs): a shell with PYTHONDONTWRITEBYTECODE=1 made every process of the accelreg arm
        # compile accelreg's modules from source, ~130 ms of its start-up
        and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(ACCELREG_EMU_NAME="npu", ACCELREG_EMU_DEVICES="2", OMP_NUM_THREADS="1", **extra)
    if os.environ.get("ACCELREG_EMU_CACHE"):
        env["ACCELREG_EMU_CACHE"] = os.environ["ACCELREG_EMU_CACHE"]
    return env


#: ``--other SRC``: a third start-up arm, ``accelreg run`` with another checkout's ``accelreg``
#: first on ``PYTHONPATH`` (a version before a change, to measure what the change did).
OTHER = "accelreg run (other checkout)"
_other_src: list[str] = []


def _rank_env(arm: str) -> dict[str, str]:
    launched = {
        "LOCAL_RANK": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    env = _environ(**launched, **({"ACCELREG_RUN": "1"} if arm in ("accelreg run", OTHER) else {}))
    if arm == OTHER:
        env["PYTHONPATH"] = os.pathsep.join([*_other_src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, of the process and its children) in ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def _paired(samples: dict[str, list[float]], arm: str, base: str) -> tuple[float, float]:
    """Median and interquartile range of the paired differences ``arm - base``."""
    diffs = [a - b for a, b in zip(samples[arm], samples[base], strict=True)]
    q = statistics.quantiles(diffs, n=4)
    return round(statistics.median(diffs), 1), round(q[2] - q[0], 1)


def startup(rounds: int) -> dict[str, object]:
    arms = ["stock", "accelreg run", *([OTHER] if _other_src else [])]
    argv = [sys.executable, "-c", RANK]
    for arm in arms:  # warm the page cache and the bytecode caches
        _run(argv, _rank_env(arm))
    wall: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            w, c = _run(argv, _rank_env(arm))
            wall[arm].append(w)
            cpu[arm].append(c)
    added, spread = _paired(wall, "accelreg run", "stock")
    added_cpu, spread_cpu = _paired(cpu, "accelreg run", "stock")
    out: dict[str, object] = {}
    if _other_src:
        out["other_added_ms"], out["other_spread_ms"] = _paired(wall, OTHER, "stock")
        out["other_added_cpu_ms"], out["other_spread_cpu_ms"] = _paired(cpu, OTHER, "stock")
    return out | {
        "stock_ms": round(statistics.median(wall["stock"]), 1),
        "accelreg_run_ms": round(statistics.median(wall["accelreg run"]), 1),
        "added_ms": added,
        "spread_ms": spread,
        "stock_cpu_ms": round(statistics.median(cpu["stock"]), 1),
        "accelreg_run_cpu_ms": round(statistics.median(cpu["accelreg run"]), 1),
        "added_cpu_ms": added_cpu,
        "spread_cpu_ms": spread_cpu,
    }


def _step(steps: int, blocks: int) -> dict[str, list[list[float]]]:
    argv = [sys.executable, "-c", STEP, str(steps), str(blocks)]
    out = subprocess.run(argv, env=_rank_env("stock"), check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def step(rounds: int, steps: int, blocks: int) -> dict[str, object]:
    """One process per round; in each, blocks of ``steps`` steps under the two arms alternate
    (``integrations.uninstall()`` / ``accelreg.install()`` between blocks, on the one prepared
    model). Per process: the median block of each arm and their ratio; then the median over
    processes."""
    per_round = [_step(steps, blocks) for _ in range(rounds)]
    out: dict[str, object] = {}
    for i, kind in enumerate(("wall", "cpu")):
        mine = [statistics.median(b[i] for b in r["install()"]) for r in per_round]
        theirs = [statistics.median(b[i] for b in r["stock"]) for r in per_round]
        ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
        out[f"stock_{kind}_ms"] = round(statistics.median(theirs), 3)
        out[f"install_{kind}_ms"] = round(statistics.median(mine), 3)
        out[f"{kind}_ratio"] = round(statistics.median(ratios), 3)
        out[f"{kind}_ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="start-up rounds (one process per arm each)")
    ap.add_argument("--step-rounds", type=int, default=5, help="training-step processes (both arms in each)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per block")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per arm in each training-step process")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--other", help="a third start-up arm: accelreg run with this folder's accelreg first on PYTHONPATH"
    )
    ap.add_argument("--startup-only", action="store_true", help="skip the training-step part")
    a = ap.parse_args()
    if a.other:
        _other_src.append(os.path.abspath(a.other))
    import accelerate
    import torch

    load_before = os.getloadavg()
    up = startup(a.rounds)
    st = step(a.step_rounds, a.steps, a.blocks) if not a.startup_only else {}
    load_after = os.getloadavg()
    print(
        f"Python {sys.version.split()[0]}, torch {torch.__version__}, accelerate {accelerate.__version__}, "
        f"emulated npu; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} cores)\n"
    )
    if a.json:  # first: a report that fails to print must not lose the figures
        Path(a.json).write_text(
            json.dumps({"startup": up, "step": st, "load": [load_before, load_after]}, indent=1)
        )
    print(f"rank start-up ({a.rounds} rounds, one process per arm each):")
    verdict = "within" if up["added_ms"] <= START_GOAL_MS else "OVER"  # type: ignore[operator]
    print(
        f"  wall time: stock {up['stock_ms']} ms, accelreg run {up['accelreg_run_ms']} ms, added "
        f"{up['added_ms']:+} ms (paired median; interquartile range {up['spread_ms']} ms), "
        f"{verdict} the {START_GOAL_MS:.0f} ms goal"
    )
    print(
        f"  CPU time: stock {up['stock_cpu_ms']} ms, accelreg run {up['accelreg_run_cpu_ms']} ms, added "
        f"{up['added_cpu_ms']:+} ms (paired median; interquartile range {up['spread_cpu_ms']} ms)"
    )
    if a.other:
        print(
            f"  {OTHER} ({a.other}): added {up['other_added_ms']:+} ms wall (IQR {up['other_spread_ms']} ms), "
            f"{up['other_added_cpu_ms']:+} ms CPU (IQR {up['other_spread_cpu_ms']} ms)"
        )
    if not st:
        return 0
    print(
        f"training step ({a.step_rounds} processes x {a.blocks} blocks per arm x {a.steps} steps, "
        "arms alternating block by block; median step):"
    )
    for kind, what in (("cpu", "process CPU time"), ("wall", "wall time")):
        verdict = "within" if st[f"{kind}_ratio"] <= STEP_GOAL else "OVER"  # type: ignore[operator]
        print(
            f"  {what}: stock {st[f'stock_{kind}_ms']} ms, install() {st[f'install_{kind}_ms']} ms, "
            f"ratio {st[f'{kind}_ratio']:.3f}x (median of per-process ratios; range {st[f'{kind}_ratio_range']}), "
            f"{verdict} the {STEP_GOAL}x goal"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
