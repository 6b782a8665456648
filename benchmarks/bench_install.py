"""What ``accelreg.install()`` costs a training rank (issue 39): its CPU time after the imports.

    python benchmarks/bench_install.py --rounds 21                # the environment as installed
    PYTHONPATH=<layer> python benchmarks/bench_install.py         # a release set (see noxfile.py)

Each round starts fresh interpreters that import what a training rank imports first — torch,
accelerate (and ``accelerate.state``), ``transformers.modeling_utils`` and peft — the arms in an
order that rotates every round:

* ``stock``: those imports alone (their CPU time is printed for scale);
* ``warm``: then ``import accelreg; accelreg.install()``, timed in process CPU time: every
  integration of an imported library is enabled inside that call (the registry's settings, the
  rows' conflict report, each library's folder, its seams matched and installed in every holder),
  with the shapes of the libraries' functions read from the on-disk cache, as in every process
  after the first on a machine (goal: <= 30 ms);
* ``cold``: the same with an empty cache (``ACCELREG_CACHE_DIR`` a new folder): the first process
  of a new release, which computes the shapes and writes them.

Medians over ``--rounds``; the load average is printed with the figures. Bytecode is written and
read as in an installation (``PYTHONDONTWRITEBYTECODE`` is dropped from the children's
environment; the first, untimed round writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

GOAL_MS = 30.0

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.process_time()
    import torch, accelerate, accelerate.state, transformers.modeling_utils, peft
    t1 = time.process_time()
    out = {"imports_ms": (t1 - t0) * 1e3}
    if sys.argv[1] != "stock":
        import accelreg
        enabled = accelreg.install()
        out["install_ms"] = (time.process_time() - t1) * 1e3
        from accelreg.integrations import status
        out["enabled"] = sorted(i["name"] for i in status() if i["enabled"])
    versions = {m: sys.modules[m].__version__ for m in ("torch", "transformers", "accelerate", "peft")}
    print("@@" + json.dumps({"out": out, "versions": versions}))
    """
)


def _environ(cache: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if cache is not None:
        env["ACCELREG_CACHE_DIR"] = cache
    return env


def run(arm: str, cache: str | None) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, arm], capture_output=True, text=True, check=True, env=_environ(cache)
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    arms = ["stock", "warm", "cold"]
    with tempfile.TemporaryDirectory() as warm_cache:
        run("warm", warm_cache)  # untimed: writes bytecode, fills the warm arm's cache
        samples: dict[str, list[float]] = {}
        result: dict[str, object] = {}
        for i in range(args.rounds):
            order = arms[i % 3 :] + arms[: i % 3]
            for arm in order:
                if arm == "cold":
                    with tempfile.TemporaryDirectory() as empty:
                        result = run(arm, empty)
                else:
                    result = run(arm, warm_cache if arm == "warm" else None)
                for key, value in result["out"].items():  # type: ignore[union-attr]
                    if isinstance(value, float):
                        samples.setdefault(f"{arm}:{key}", []).append(value)
        enabled = run("warm", warm_cache)["out"]["enabled"]  # type: ignore[index]
    med = {k: statistics.median(v) for k, v in samples.items()}
    versions = result["versions"]
    load = os.getloadavg()
    print(
        f"torch {versions['torch']}, transformers {versions['transformers']}, accelerate "  # type: ignore[index]
        f"{versions['accelerate']}, peft {versions['peft']}; median of {args.rounds} fresh processes "  # type: ignore[index]
        f"per arm, arms rotating; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"enabled by install(): {', '.join(enabled)}")
    print()
    print("| what (process CPU time) | median | goal |")
    print("| --- | ---: | ---: |")
    print(
        f"| the imports (torch, accelerate, transformers.modeling_utils, peft), stock | {med['stock:imports_ms']:.0f} ms | — |"
    )
    warm = med["warm:install_ms"]
    verdict = "met" if warm <= GOAL_MS else "NOT met"
    print(
        f"| `import accelreg; accelreg.install()` after them, shape cache warm | {warm:.1f} ms | <= {GOAL_MS:.0f} ms ({verdict}) |"
    )
    print(
        f"| the same, shape cache empty (the first process of a release) | {med['cold:install_ms']:.1f} ms | — |"
    )
    print()
    print("```json")
    print(json.dumps({"versions": versions, "samples_ms": samples}, indent=1))
    print("```")


if __name__ == "__main__":
    main()
