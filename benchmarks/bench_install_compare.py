"""``install()`` in a job process, two versions of accelreg side by side (issue 28).

    git archive <rev> accelreg | tar -x -C /tmp/before
    python benchmarks/bench_install_compare.py --rounds 21 /tmp/before .

Each round starts one fresh interpreter per tree (the order alternating every round), which
imports torch and accelerate, then times ``import accelreg; accelreg.install()`` in process CPU
time and wall time, with that tree first on ``PYTHONPATH``. What a rank of ``accelreg run --
accelerate launch`` pays for accelreg at ``import accelerate``, without the second of interpreter
and process-group start-up that makes the whole rank too noisy to resolve it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CODE = (
    "import time, torch, accelerate\n"
    "t = time.process_time(); w = time.perf_counter()\n"
    "import accelreg; accelreg.install()\n"
    "print((time.process_time() - t) * 1e3, (time.perf_counter() - w) * 1e3, accelreg.__file__)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", type=Path, help="folders that hold an accelreg package")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    # children write bytecode: a process that compiles accelreg from source measures the compiler
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    trees = [t.resolve() for t in args.trees]
    results: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    for r in range(args.rounds + 1):  # round 0 writes the bytecode and is not counted
        for tree in trees if r % 2 else trees[::-1]:
            out = subprocess.run(
                [sys.executable, "-c", CODE],
                env={**env, "PYTHONPATH": str(tree)},
                cwd="/",
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert Path(out[2]).is_relative_to(tree), (out[2], tree)
            if r:
                results[tree].append((float(out[0]), float(out[1])))
    load = os.getloadavg()[0]
    print(f"Python {sys.version.split()[0]}; load average {load:.1f} after; {args.rounds} rounds")
    for tree, values in results.items():
        cpu = statistics.median(v[0] for v in values)
        wall = statistics.median(v[1] for v in values)
        print(f"{tree}: install() CPU median {cpu:.1f} ms, wall median {wall:.1f} ms")


if __name__ == "__main__":
    main()
