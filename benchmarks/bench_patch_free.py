"""What the patch-free path costs: bytes on accelerators, ``device_map_for`` against ``install()``.

    python benchmarks/bench_patch_free.py            # shapes and the architecture scan (~10 min on 2 cores)
    python benchmarks/bench_patch_free.py --shapes   # only the full-depth shapes (~2 min)

A map for ``install()`` (``plan_device_map``) keeps the offload headroom on its main device only:
accelreg's ``dispatch_model`` wrapper runs the offloaded layers there. Stock accelerate 1.15+
runs them on a hash-ordered pick among the map's accelerators, so ``device_map_for`` keeps the
headroom on *every* accelerator it uses (``plan(..., any_main=True)``), or uses fewer of them.
Both are the most resident maps under their rule (exact search). This prints, over the same
inputs as ``bench_planner_residency.py`` (full-depth GPT-2, Llama-7B tied and untied, T5-base,
Whisper-small under 17 budgets each; every causal-LM, seq2seq-LM, masked-LM and pretraining
class at two layers under issue 12's offload scenarios), for the cases where something is
offloaded and the ``install()`` map keeps something on the accelerators: how many cost nothing,
and the cost as a share of the model and of what the ``install()`` map keeps on the
accelerators (median, 90th percentile, worst). Where nothing is offloaded both maps are the
same; where the install() map keeps nothing on the accelerators (a tied embedding larger than
every device that must be offloaded, so no device can run it), neither does the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_planner_residency import OFFLOAD, shape_budgets  # noqa: E402

import accelreg  # noqa: E402
from accelreg.planner import plan  # noqa: E402
from tests._planner_support import build_class, quiet  # noqa: E402
from tests.test_planner_residency import SHAPES, full_depth  # noqa: E402

warnings.filterwarnings("ignore")


def case(model: Any, budgets: dict[str, int], dtype: Any = None) -> dict[str, Any] | None:
    """Both plans for one model and budget; ``None`` when no map fits."""
    try:
        installed = plan(model, budgets, dtype=dtype)
        patch_free = plan(model, budgets, dtype=dtype, any_main=True)
    except accelreg.DeviceMapError:
        return None
    accelreg.check_device_map(model, patch_free.device_map, budgets, dtype=dtype, any_main=True)
    offloaded = any(u.used for u in installed.places if u.place in ("cpu", "disk"))
    used = sum(1 for u in installed.places if u.used and u.place not in ("cpu", "disk"))
    return {
        "total": installed.total,
        "install": installed.resident,
        "patch_free": patch_free.resident,
        "offloaded": offloaded,
        "accelerators_used": used,
        "same_map": installed.device_map == patch_free.device_map,
    }


def shapes(log=None) -> list[dict]:
    rows = []
    for name in SHAPES:
        model, dtype = full_depth(name)
        total = plan(model, {"cpu": 1 << 62}, dtype=dtype).total
        for label, budgets in shape_budgets(total).items():
            row = case(model, budgets, dtype)
            if row is not None:
                rows.append({**row, "model": name, "scenario": label})
        if log:
            log(f"{name}: done")
    return rows


def scan(log=None) -> list[dict]:
    import transformers

    from accelreg.planner.plan import analyze
    from tests.test_planner_archs import mapping_classes

    rows = []
    for name in mapping_classes():
        if not hasattr(transformers, name):
            continue
        try:
            model = build_class(name)
        except Exception:  # noqa: BLE001 - unbuildable classes are listed in docs/planner.md
            continue
        total = analyze(model)[0].total
        for label, make in OFFLOAD.items():
            row = case(model, make(total))
            if row is not None:
                rows.append({**row, "model": name, "scenario": label})
        if log and len(rows) % 60 < 3:
            log(f"{name}: {len(rows)} cases")
    return rows


def summary(rows: list[dict]) -> dict[str, Any]:
    """Counts, and the cost over the cases where something is offloaded and the install() map
    keeps bytes on the accelerators (otherwise both keep nothing there)."""
    off = [r for r in rows if r["offloaded"]]
    kept = [r for r in off if r["install"] > 0]
    of_model = sorted((r["install"] - r["patch_free"]) / r["total"] for r in kept)
    of_resident = sorted((r["install"] - r["patch_free"]) / r["install"] for r in kept)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else 0.0

    return {
        "cases": len(rows),
        "offloaded": len(off),
        "kept": len(kept),
        "free": sum(r["install"] == r["patch_free"] for r in kept),
        "more_than_install": sum(r["patch_free"] > r["install"] for r in off),  # would be a bug
        "model_median": statistics.median(of_model) if of_model else 0.0,
        "model_p90": pct(of_model, 0.9),
        "model_worst": of_model[-1] if of_model else 0.0,
        "resident_median": statistics.median(of_resident) if of_resident else 0.0,
        "resident_p90": pct(of_resident, 0.9),
        "resident_worst": of_resident[-1] if of_resident else 0.0,
    }


def markdown(groups: dict[str, dict[str, Any]]) -> str:
    out = [
        "| inputs | cases | something offloaded | of those, the install() map keeps bytes on accelerators | "
        "of those, no cost | cost, share of the model: median / 90th pct / worst | cost, share of the "
        "install() map's resident bytes: median / 90th pct / worst |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, s in groups.items():
        out.append(
            f"| {label} | {s['cases']} | {s['offloaded']} | {s['kept']} | {s['free']} | "
            f"{100 * s['model_median']:.1f} % / {100 * s['model_p90']:.1f} % / {100 * s['model_worst']:.1f} % | "
            f"{100 * s['resident_median']:.1f} % / {100 * s['resident_p90']:.1f} % / "
            f"{100 * s['resident_worst']:.1f} % |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", action="store_true", help="only the full-depth shapes")
    parser.add_argument("--json", action="store_true", help="raw rows and summaries")
    args = parser.parse_args(argv)
    quiet()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows = {"full-depth shapes, 17 budgets each": shapes(log)}
    if not args.shapes:
        rows["architecture scan (two layers), issue 12's offload scenarios"] = scan(log)
    groups = {label: summary(r) for label, r in rows.items()}
    for label, s in groups.items():
        if s["more_than_install"]:
            raise AssertionError(f"{label}: a patch-free map keeps more than the install() optimum")
    if args.json:
        print(json.dumps({"summary": groups, "rows": rows}, indent=2))
        return 0
    print(markdown(groups))
    by_model: dict[str, list[float]] = {}
    for r in rows["full-depth shapes, 17 budgets each"]:
        if r["offloaded"] and r["install"] > 0:
            by_model.setdefault(r["model"], []).append((r["install"] - r["patch_free"]) / r["total"])
    print()
    for name, costs in by_model.items():
        print(
            f"- {name}: median {100 * statistics.median(costs):.1f} %, worst {100 * max(costs):.1f} % of the model"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
