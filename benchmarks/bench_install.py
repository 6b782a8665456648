"""What ``accelreg.install()`` costs: the call itself, and the enabling it defers to imports.

    python benchmarks/bench_install.py --repeat 7             # the environment as installed
    PYTHONPATH=<layer> python benchmarks/bench_install.py     # a release set (see noxfile.py)

Fresh interpreters, alternating stock and installed, median of ``--repeat`` each:

* ``install()`` with none of the libraries imported (what a user's first line pays);
* ``import accelerate, transformers.modeling_utils, peft`` stock vs after ``install()`` (the
  integrations are enabled inside those imports: seam matching, shapes, holder scans);
* each integration's ``enable()`` with its library already imported, and the static survey
  ``accelreg env`` does (reads the sources, imports nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch, accelreg
    mode = sys.argv[1]
    t0 = time.perf_counter()
    if mode == "installed":
        accelreg.install()
    t1 = time.perf_counter()
    import accelerate, transformers.modeling_utils, peft
    t2 = time.perf_counter()
    out = {"install_s": t1 - t0, "import_s": t2 - t1}
    if mode == "stock":
        from accelreg.integrations import integration
        for name in ("accelerate", "transformers", "peft"):
            integ = integration(name)
            t = time.perf_counter(); integ.survey(); out[f"survey_{name}_s"] = time.perf_counter() - t
            t = time.perf_counter(); integ.enable(); out[f"enable_{name}_s"] = time.perf_counter() - t
            integ.disable()
    versions = {m: sys.modules[m].__version__ for m in ("transformers", "accelerate", "peft")}
    print("@@" + json.dumps({"out": out, "versions": versions}))
    """
)


def run(mode: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    run("stock")  # warm the page cache
    samples: dict[str, list[float]] = {}
    versions: dict[str, str] = {}
    for i in range(args.repeat):
        for mode in ("stock", "installed") if i % 2 == 0 else ("installed", "stock"):
            result = run(mode)
            versions = result["versions"]  # type: ignore[assignment]
            for key, value in result["out"].items():  # type: ignore[union-attr]
                samples.setdefault(f"{mode}:{key}", []).append(value)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(
        f"transformers {versions['transformers']}, accelerate {versions['accelerate']}, peft {versions['peft']}; "
        f"median of {args.repeat} fresh processes each, alternating"
    )
    print()
    print("| what | stock | with `install()` | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| `accelreg.install()` (nothing imported yet) | — | {med['installed:install_s'] * 1e3:.1f} ms | — |"
    )
    stock, ours = med["stock:import_s"], med["installed:import_s"]
    print(
        f"| `import accelerate, transformers.modeling_utils, peft` | {stock:.2f} s | {ours:.2f} s | {ours / stock:.3f} |"
    )
    for name in ("accelerate", "transformers", "peft"):
        print(
            f"| `{name}` integration: `enable()` (library imported) / static survey | — "
            f"| {med[f'stock:enable_{name}_s'] * 1e3:.1f} ms / {med[f'stock:survey_{name}_s'] * 1e3:.1f} ms | — |"
        )
    print()
    print("```json")
    print(json.dumps({"versions": versions, "samples_s": samples}, indent=1))
    print("```")


if __name__ == "__main__":
    main()
