"""What ``accelreg run`` adds to the start-up of a Python process (issue 19, goal: <= 30 ms).

    python benchmarks/bench_startup.py --rounds 31

Fresh interpreters, the arms in alternation (the order rotates every round, so machine noise
hits all alike), wall time of each process from the parent, median of ``--rounds``:

* ``bare`` — ``python -c pass`` outside a job (the ``.pth`` line reads one variable);
* ``job process`` — the same under ``ACCELREG_RUN=1``, as every Python process of a job runs
  (launchers, ranks, workers): the start-up hook arms, imports nothing of the registry;
* ``accelreg run`` — ``accelreg run -- python -c pass``: the wrapper, paid once per job (it
  imports the CLI and execs the command, which is then a job process).

The added cost is the median of the paired differences (each round's arm minus that round's
bare). ``-X importtime`` of a job process lists what the hook imports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 30.0


def _environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    env.update(extra)
    return env


def _accelreg() -> list[str]:
    script = Path(sys.executable).with_name("accelreg")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "accelreg"]


ARMS: dict[str, tuple[list[str], dict[str, str]]] = {
    "bare": ([sys.executable, "-c", "pass"], _environ()),
    "job process": ([sys.executable, "-c", "pass"], _environ(ACCELREG_RUN="1")),
    "accelreg run": ([*_accelreg(), "run", "--", sys.executable, "-c", "pass"], _environ()),
}


def _wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _hook_imports() -> tuple[list[str], float]:
    """Modules a job process imports for the hook, and the hook's cumulative import time (ms)."""
    argv = [sys.executable, "-X", "importtime", "-c", "pass"]
    proc = subprocess.run(argv, env=_environ(ACCELREG_RUN="1"), capture_output=True, text=True, check=True)
    bare = subprocess.run(argv, env=_environ(), capture_output=True, text=True, check=True)

    def modules(text: str) -> dict[str, int]:
        out = {}
        for line in text.splitlines():
            if line.startswith("import time:") and "|" in line:
                _, cumulative, name = line.split("|")
                if cumulative.strip().isdigit():
                    out[name.strip()] = int(cumulative)
        return out

    armed, plain = modules(proc.stderr), modules(bare.stderr)
    added = [name for name in armed if name not in plain]
    return added, armed.get("accelreg.launch.startup", 0) / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    names = []
    for name, (argv, env) in ARMS.items():  # warm the page cache and the bytecode caches
        try:
            _wall(argv, env)
        except subprocess.CalledProcessError as exc:  # e.g. the CLI's dependencies are missing
            print(f"{name}: left out, it fails here ({exc})", file=sys.stderr)
            continue
        names.append(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(a.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            samples[name].append(_wall(*ARMS[name]) * 1000)
    added, hook_ms = _hook_imports()
    bare = samples["bare"]
    rows = []
    for name in names:
        diffs = [x - b for x, b in zip(samples[name], bare, strict=True)]
        rows.append(
            {
                "arm": name,
                "median_ms": round(statistics.median(samples[name]), 1),
                "added_ms": round(statistics.median(diffs), 1),
                "ratio": round(statistics.median(x / b for x, b in zip(samples[name], bare, strict=True)), 3),
            }
        )
    print(f"Python {sys.version.split()[0]}, {a.rounds} rounds, load average {os.getloadavg()[0]:.1f}\n")
    print("| process | median ms | added ms (paired median) | x bare |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['arm']} | {row['median_ms']} | {row['added_ms']:+} | {row['ratio']:.2f} |")
    job = next(r for r in rows if r["arm"] == "job process")
    verdict = "within" if job["added_ms"] <= TARGET_MS else "OVER"
    print(f"\njob process: {job['added_ms']:+} ms, {verdict} the {TARGET_MS:.0f} ms goal")
    print(
        f"hook's own imports (-X importtime, one run): {hook_ms:.1f} ms cumulative; modules: {', '.join(added)}"
    )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"rows": rows, "hook_imports": added, "hook_ms": hook_ms}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
