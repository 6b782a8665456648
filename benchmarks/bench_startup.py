"""What ``accelreg-startup.pth`` and ``accelreg run`` add to the start-up of a Python process.

    python benchmarks/bench_startup.py --rounds 61

Goals: a plain Python process with the ``.pth`` installed starts within 1.05x of one without it
(issue 29), and a job process at most 30 ms later than a plain one (issue 19). Fresh
interpreters, the arms in alternation (the order rotates every round, so machine noise hits all
alike), wall time of each process from the parent, median of ``--rounds``. Two throwaway
virtual environments (``tests/_venvs.py``: links to this environment's site-packages, every
``.pth`` file included) differ only by ``accelreg-startup.pth``:

* ``no .pth`` — ``python -c pass`` in the one without it (the baseline);
* ``with .pth`` — ``python -c pass`` in the one with it, outside a job (the line reads two
  variables and imports nothing);
* ``job process`` — the same under ``ACCELREG_RUN=1``, as every Python process of a job runs
  (launchers, ranks, workers): the hook arms, imports nothing of the registry;
* ``accelreg run`` — ``python -m accelreg run -- python -c pass``: the wrapper, paid once per job
  (it imports the CLI and execs the command, which is then a job process).

"added" is the median of the paired differences (each round's arm minus that round's baseline);
"x" the median of the paired ratios; both for the wall time and for the CPU time (user +
system, from ``wait4``) of each process, the steadier figure on a busy machine. ``-X
importtime`` of a job process lists what the hook imports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests._venvs import throwaway_venv  # noqa: E402 - the repository root is put on the path first

TARGET_RATIO = 1.05
TARGET_MS = 30.0
PTH = "accelreg-startup.pth"


def _environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELREG_", "PYTHON"))}
    env.update(extra)
    return env


def _arms(root: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    without = str(throwaway_venv(root / "without", leave_out=(PTH,)))
    with_pth = str(throwaway_venv(root / "with"))
    return {
        "no .pth": ([without, "-c", "pass"], _environ()),
        "with .pth": ([with_pth, "-c", "pass"], _environ()),
        "job process": ([with_pth, "-c", "pass"], _environ(ACCELREG_RUN="1")),
        "accelreg run": ([with_pth, "-m", "accelreg", "run", "--", with_pth, "-c", "pass"], _environ()),
    }


def _wall(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time of one process from the parent, and the CPU time (user + system) it used: on a
    busy machine the second is the steadier figure (it leaves out the time spent waiting for a
    core)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, cwd=os.path.dirname(argv[0]))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def _paired(xs: list[float], bases: list[float]) -> float:
    """The median of the paired differences, in ms."""
    return round(statistics.median(x - b for x, b in zip(xs, bases, strict=True)), 1)


def _figures(samples: dict[str, list[float]], name: str) -> dict[str, float]:
    """Median, paired added time and paired ratio of ``name`` against the ``no .pth`` baseline."""
    base = samples["no .pth"]
    return {
        "median_ms": round(statistics.median(samples[name]), 1),
        "added_ms": _paired(samples[name], base),
        "ratio": round(statistics.median(x / b for x, b in zip(samples[name], base, strict=True)), 3),
    }


def _hook_imports(python: str) -> tuple[list[str], float]:
    """Modules a job process imports for the hook, and the hook's cumulative import time (ms)."""
    argv = [python, "-X", "importtime", "-c", "pass"]
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
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="accelreg-bench-startup-") as tmp:
        arms = _arms(Path(tmp))
        names = []
        for name, (argv, env) in arms.items():  # warm the page cache and the bytecode caches
            try:
                _wall(argv, env)
            except subprocess.CalledProcessError as exc:  # e.g. the CLI's dependencies are missing
                print(f"{name}: left out, it fails here ({exc})", file=sys.stderr)
                continue
            names.append(name)
        wall: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        load_before = os.getloadavg()[0]
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                w, c = _wall(*arms[name])
                wall[name].append(w * 1000)
                cpu[name].append(c * 1000)
        load_after = os.getloadavg()[0]
        added, hook_ms = _hook_imports(arms["with .pth"][0][0])
    rows = [{"arm": name, "wall": _figures(wall, name), "cpu": _figures(cpu, name)} for name in names]
    print(
        f"Python {sys.version.split()[0]}, {a.rounds} rounds, load average {load_before:.1f} before, "
        f"{load_after:.1f} after\n"
    )
    print("| process | wall median ms | added ms | x no .pth | CPU median ms | added ms | x no .pth |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        cells = [
            f"{f['median_ms']} | {f['added_ms']:+} | {f['ratio']:.3f}" for f in (row["wall"], row["cpu"])
        ]
        print(f"| {row['arm']} | {' | '.join(cells)} |")
    verdicts = {}
    for kind, samples in (("wall", wall), ("cpu", cpu)):
        by = {row["arm"]: row[kind] for row in rows}
        ratio = by["with .pth"]["ratio"]
        job = _paired(samples["job process"], samples["with .pth"])
        verdicts[kind] = {"with_pth_ratio": ratio, "job_vs_plain_ms": job}
        print(
            f"\n{kind}: plain process with the .pth x{ratio:.3f} "
            f"({'within' if ratio <= TARGET_RATIO else 'OVER'} the x{TARGET_RATIO} goal); "
            f"job process {job:+} ms against a plain one with the .pth, "
            f"{by['job process']['added_ms']:+} ms against none "
            f"({'within' if job <= TARGET_MS else 'OVER'} the {TARGET_MS:.0f} ms goal)"
        )
    print(
        f"hook's own imports (-X importtime, one run): {hook_ms:.1f} ms cumulative; modules: {', '.join(added)}"
    )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"rows": rows, "verdicts": verdicts, "hook_imports": added, "hook_ms": hook_ms}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
