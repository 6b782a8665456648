"""How much of the model each planner keeps on accelerators, against the exact optimum.

    python benchmarks/bench_planner_residency.py            # Markdown tables (~15 min on 2 cores)
    python benchmarks/bench_planner_residency.py --shapes   # only the full-depth shapes (~2 min)
    python benchmarks/bench_planner_residency.py --write-reference tests/data/planner_optimum.json

Every offloaded byte is streamed to the main device on every forward pass, so once a model does
not fit, what matters is how much stays on the accelerators. The exact optimum comes from the
MILP in ``tests/test_planner_reference.py`` (the documented rules; any used accelerator may be
the main device); ratios are taken against its upper bound. Inputs:

* the architecture scan: every causal-LM, seq2seq-LM, masked-LM and pretraining class of
  transformers that builds on meta (two layers, ``tests/_planner_support.build_class``),
  under issue 12's offload scenarios (4 devices of size/5 + cpu; 8 devices of size/10 + cpu;
  2 devices of size/3 + cpu of size/4 + disk) and, for the reference file, issue 4's four;
* full-depth GPT-2, Llama-7B (tied and untied, bf16), T5-base and Whisper-small shapes under
  budgets where 60-90 % fits (2, 3, 4, 8 devices) and 2 x 1/3 + cpu 1/4 + disk.

accelreg gets ``npu:<i>`` budgets; accelerate's and transformers' ``infer_auto_device_map``
the same budgets with int keys (their maps are read back as ``npu:<i>``). Upstream always may
spill to an unbounded disk and does not keep offload headroom, so its maps are also checked
with ``check_device_map``; its residency is reported for every map it returns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import accelreg  # noqa: E402
from accelreg.planner import plan  # noqa: E402
from accelreg.planner.check import loads  # noqa: E402
from accelreg.planner.maps import expand  # noqa: E402
from accelreg.planner.plan import analyze  # noqa: E402
from tests._planner_support import build_class, quiet  # noqa: E402
from tests.test_planner_reference import optimum, problem_of  # noqa: E402
from tests.test_planner_residency import SHAPES, full_depth  # noqa: E402

warnings.filterwarnings("ignore")

OFFLOAD = {
    "4 x size/5 + cpu": lambda t: {**{f"npu:{i}": t // 5 for i in range(4)}, "cpu": 2 * t},
    "8 x size/10 + cpu": lambda t: {**{f"npu:{i}": t // 10 for i in range(8)}, "cpu": 2 * t},
    "2 x size/3 + cpu size/4 + disk": lambda t: {
        "npu:0": t // 3,
        "npu:1": t // 3,
        "cpu": t // 4,
        "disk": 10**13,
    },
}
#: Issue 4's scenarios (tests/test_planner_archs.py): in the reference file only.
VALIDITY = {
    "one big device": lambda t: {"npu:0": 2 * t, "cpu": 2 * t},
    "4 devices of a third": lambda t: {**{f"npu:{i}": t // 3 for i in range(4)}, "cpu": 2 * t},
    "8 devices of a quarter": lambda t: {**{f"npu:{i}": t // 4 for i in range(8)}, "cpu": 2 * t},
    "2 devices of half + small cpu": lambda t: {"npu:0": t // 2, "npu:1": t // 2, "cpu": t // 4},
}


def shape_budgets(total: int) -> dict[str, dict[str, int]]:
    out = {}
    for k in (2, 3, 4, 8):
        for share in (0.6, 0.7, 0.8, 0.9):
            out[f"{k} x {share:.0%}/{k} + cpu"] = {
                **{f"npu:{i}": int(total * share / k) for i in range(k)},
                "cpu": 2 * total,
            }
    out["2 x 1/3 + cpu 1/4 + disk"] = {
        "npu:0": total // 3,
        "npu:1": total // 3,
        "cpu": total // 4,
        "disk": 10**13,
    }
    return out


def upstream_maps(model: Any, budgets: dict[str, int]) -> dict[str, Any]:
    """Each upstream planner's map for int-keyed budgets (or the exception it raised)."""
    from accelerate.utils import infer_auto_device_map as acc_infer
    from transformers.integrations.accelerate import _get_device_map

    ints = {(int(k.split(":")[1]) if k.startswith("npu:") else k): v for k, v in budgets.items()}
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    out: dict[str, Any] = {}
    for who, fn in (
        ("accelerate", lambda: acc_infer(model, max_memory=dict(ints), no_split_module_classes=no_split)),
        ("transformers auto", lambda: _get_device_map(model, "auto", dict(ints), None)),
    ):
        try:
            found = fn()
        except Exception as exc:  # noqa: BLE001 - recorded
            out[who] = exc
            continue
        out[who] = {k: (f"npu:{v}" if isinstance(v, int) else v) for k, v in found.items()}
    return out


def resident(model: Any, device_map: dict[str, Any], dtype: Any = None) -> int:
    layout = analyze(model, dtype=dtype)[0]
    used = loads(layout, expand(layout, device_map)[0])
    return sum(v for k, v in used.items() if k not in ("cpu", "disk"))


def valid(model: Any, device_map: dict[str, Any], budgets: dict[str, int], dtype: Any = None) -> bool:
    try:
        accelreg.check_device_map(model, device_map, budgets, dtype=dtype)
    except accelreg.DeviceMapError:
        return False
    return True


def case(model: Any, budgets: dict[str, int], dtype: Any = None, *, with_upstream: bool = True) -> dict:
    """One model under one budget: the optimum, accelreg, and upstream."""
    best = optimum(problem_of(model, budgets, dtype=dtype))
    row: dict[str, Any] = {"optimum": None if best is None else best.upper}
    if best is not None and best.open:  # between a valid placement (if any) and the bound
        row["open"] = None if best.targets is None else best.resident
    start = time.perf_counter()
    try:
        result = plan(model, budgets, dtype=dtype)
    except accelreg.DeviceMapError as exc:
        row["accelreg"] = {"refused": True, "gave_up": "search limit" in str(exc)}
    else:
        row["accelreg"] = {
            "resident": result.resident,
            "valid": valid(model, result.device_map, budgets, dtype),
            "optimal": result.optimal,
        }
    row["accelreg_s"] = time.perf_counter() - start
    if with_upstream:
        for who, found in upstream_maps(model, budgets).items():
            if isinstance(found, Exception):
                row[who] = {"raises": type(found).__name__}
            else:
                row[who] = {
                    "resident": resident(model, found, dtype),
                    "valid": valid(model, found, budgets, dtype),
                }
    return row


def summarize(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per planner: cases with a valid map possible, how many within 0.98, the worst ratio."""
    out: dict[str, dict[str, Any]] = {}
    for who in ("accelreg", "accelerate", "transformers auto"):
        ratios, refused_wrongly, raised, invalid, proven_refusals, beyond = [], 0, 0, 0, 0, 0
        for row in rows:
            got = row.get(who)
            if got is None:
                continue
            best = row["optimum"]
            if best is None:
                if got.get("refused"):
                    proven_refusals += 1
                elif got.get("valid"):  # a valid map where the reference says none exists
                    beyond += 1
                continue
            if got.get("valid") and got["resident"] > best * (1 + 1e-6):  # the reference: exact to ~1e-6
                beyond += 1
            if "raises" in got:
                raised += 1
                ratios.append(0.0)
                continue
            if got.get("refused"):
                refused_wrongly += 1
                ratios.append(0.0)
                continue
            invalid += not got["valid"]
            ratios.append(got["resident"] / best if best > 1 else 1.0)
        out[who] = {
            "cases": len(ratios),
            "within_0.98": sum(r >= 0.98 for r in ratios),
            "worst": min(ratios, default=1.0),
            "median": statistics.median(ratios) if ratios else 1.0,
            "refused_but_a_map_exists": refused_wrongly,
            "proven_refusals": proven_refusals,
            "raises": raised,
            "invalid_maps": invalid,
            "valid_beyond_the_reference": beyond,  # would mean the reference is wrong: never seen
        }
    return out


def scan(scenarios: dict, *, with_upstream: bool = True, log=None) -> tuple[list[dict], dict]:
    import transformers

    from tests.test_planner_archs import mapping_classes

    rows, reference = [], {}
    for name in mapping_classes():
        if not hasattr(transformers, name):
            continue
        try:
            model = build_class(name)
        except Exception:  # noqa: BLE001 - unbuildable classes are listed in docs/planner.md
            continue
        total = analyze(model)[0].total
        reference[name] = {"total": total, "optimum": {}}
        for label, make in scenarios.items():
            row = case(model, make(total), with_upstream=with_upstream and label in OFFLOAD)
            row.update(model=name, scenario=label)
            reference[name]["optimum"][label] = row["optimum"]
            if "open" in row:
                reference[name].setdefault("open", {})[label] = row["open"]
            rows.append(row)
        if log:
            log(f"{name}: {len(rows)} cases")
    return rows, reference


def shapes(log=None) -> list[dict]:
    rows = []
    for name in SHAPES:
        model, dtype = full_depth(name)
        total = plan(model, {"cpu": 1 << 62}, dtype=dtype).total
        for label, budgets in shape_budgets(total).items():
            row = case(model, budgets, dtype)
            row.update(model=name, scenario=label)
            rows.append(row)
        if log:
            log(f"{name}: done")
    return rows


def markdown(summary: dict, title: str) -> str:
    out = [f"\n{title}\n"]
    out.append(
        "| planner | cases a valid map exists | within 0.98 of the optimum | worst | median | "
        "refused, but a map exists | raises | maps that break a rule |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for who, s in summary.items():
        out.append(
            f"| {who} | {s['cases']} | {s['within_0.98']} | {s['worst']:.3f} | {s['median']:.3f} | "
            f"{s['refused_but_a_map_exists']} | {s['raises']} | {s['invalid_maps']} |"
        )
    return "\n".join(out)


def times(rows: list[dict]) -> str:
    t = sorted(r["accelreg_s"] for r in rows)
    return (
        f"accelreg planning time per case: median {1000 * statistics.median(t):.1f} ms, "
        f"95th percentile {1000 * t[int(0.95 * (len(t) - 1))]:.1f} ms, max {1000 * t[-1]:.0f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", action="store_true", help="only the full-depth shapes")
    parser.add_argument("--json", action="store_true", help="raw rows and summaries")
    parser.add_argument("--write-reference", metavar="FILE", help="store the scan's optima for tests")
    args = parser.parse_args(argv)
    quiet()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results: dict[str, Any] = {}
    shape_rows = shapes(log)
    results["shapes"] = {"summary": summarize(shape_rows), "rows": shape_rows}
    if not args.shapes:
        scenarios = {**OFFLOAD, **(VALIDITY if args.write_reference else {})}
        scan_rows, reference = scan(scenarios, log=log)
        offload_rows = [r for r in scan_rows if r["scenario"] in OFFLOAD]
        results["scan"] = {"summary": summarize(offload_rows), "rows": offload_rows}
        if args.write_reference:
            import transformers

            data = {
                "about": "exact optimum (MILP upper bound, bytes on accelerators) per class and budget "
                "scenario; null: no valid map; 'open': scenarios where the solver's best placements "
                "overshoot a budget by a few bytes, with the best valid placement found (the optimum lies "
                "between). Written by benchmarks/bench_planner_residency.py.",
                "transformers": transformers.__version__,
                "classes": reference,
            }
            Path(args.write_reference).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return 0
    print(markdown(results["shapes"]["summary"], "Full-depth shapes (on meta), 17 budgets each:"))
    print("\n" + times(shape_rows))
    if "scan" in results:
        print(
            markdown(
                results["scan"]["summary"], "Architecture scan (two layers), issue 12's offload scenarios:"
            )
        )
        print("\n" + times(results["scan"]["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
