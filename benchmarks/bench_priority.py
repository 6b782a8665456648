"""The first ``resolve()`` with a long ``ACCELREG_PRIORITY`` of names no plugin provides (issue 40).

    python benchmarks/bench_priority.py --rounds 11
    python benchmarks/bench_priority.py --rounds 11 --tree /tmp/base   # another checkout's accelreg

Fresh interpreters, each timing its own first ``accelreg.resolve()`` after ``import torch,
accelreg`` (settings, entry points, probes, the warning about unknown names) and counting the
accelreg warnings it gave; the list lengths in alternation (the order rotates every round, so
machine noise hits all alike), median of ``--rounds``. "added" is the median of the paired
differences from the one-name list of the same round. The accelreg measured is ``--tree``'s
(default: this checkout): the processes start in that folder, which Python puts first on the
path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import json, time, warnings
import torch, accelreg
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t = time.perf_counter()
    accelreg.resolve()
    ms = (time.perf_counter() - t) * 1e3
told = [w for w in caught if str(w.message).startswith("accelreg: priority")]
print(json.dumps({"ms": ms, "warnings": len(told), "file": accelreg.__file__}))
"""


def _one(n: int, tree: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    env["ACCELREG_PRIORITY"] = ",".join(f"nope{i}" for i in range(n))
    res = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, env=env, cwd=tree
    )
    return json.loads(res.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose accelreg is measured")
    parser.add_argument("--lengths", default="1,2000,8000", help="list lengths, comma-separated")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    samples: dict[int, list[dict[str, float]]] = {n: [] for n in lengths}
    _one(1, args.tree)  # warm-up: byte-code caches, the page cache
    for r in range(args.rounds):
        order = lengths[r % len(lengths) :] + lengths[: r % len(lengths)]
        for n in order:
            samples[n].append(_one(n, args.tree))
    first = lengths[0]
    print(f"accelreg from {samples[first][0]['file']}, median of {args.rounds} fresh processes\n")
    print("| unknown names | first `resolve()` ms | added ms | accelreg warnings |")
    print("| ---: | ---: | ---: | ---: |")
    for n in lengths:
        ms = statistics.median(s["ms"] for s in samples[n])
        added = statistics.median(s["ms"] - b["ms"] for s, b in zip(samples[n], samples[first], strict=True))
        told = statistics.median(s["warnings"] for s in samples[n])
        print(f"| {n:,} | {ms:.1f} | {added:+.1f} | {told:.0f} |")


if __name__ == "__main__":
    main()
