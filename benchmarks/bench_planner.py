"""The device-map planner against accelerate's and transformers' ``infer_auto_device_map``.

    python benchmarks/bench_planner.py            # Markdown tables (a few minutes on 2 cores)
    python benchmarks/bench_planner.py --quick    # smaller upstream runs of the flat-model series
    python benchmarks/bench_planner.py --json     # machine-readable
    python benchmarks/bench_planner.py --scan     # validity of every planner's maps, every LM class

Same model, same budgets, one process; each figure is the median of several runs (``repeat``);
the Llama rows time the planners in alternation, one call of each per round.
Building the meta model is the caller's cost and is timed separately. Upstream logs a warning
for every int device key it cannot see on this CPU-only machine; those loggers are silenced so
that upstream is timed at its best. Upstream gets int keys (it knows no others); accelreg gets
the same budgets as ``npu:<i>`` keys.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import accelreg
from accelreg.planner import plan
from accelreg.planner.report import quality

warnings.filterwarnings("ignore")


def quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    for name in ("accelerate", "accelerate.utils.modeling", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def median_s(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def interleaved_s(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternation (one call of each per
    round), so that load on a shared machine hits every planner alike."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in runs.items()}


def npu(budgets: dict[Any, int]) -> dict[str, int]:
    return {(f"npu:{k}" if isinstance(k, int) else k): v for k, v in budgets.items()}


def upstream(model: nn.Module, budgets: dict[Any, int], no_split: list[str] | None):
    from accelerate.utils import infer_auto_device_map as acc_infer
    from transformers.integrations.accelerate import _get_device_map
    from transformers.integrations.accelerate import infer_auto_device_map as tf_infer

    if not hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}
    runs = {
        "accelerate": lambda: acc_infer(model, max_memory=dict(budgets), no_split_module_classes=no_split),
        "transformers": lambda: tf_infer(
            model, max_memory=dict(budgets), no_split_module_classes=set(no_split or ())
        ),
    }
    if hasattr(model, "_no_split_modules") and hasattr(model, "config"):
        runs["transformers auto"] = lambda: _get_device_map(model, "auto", dict(budgets), None)
    return runs


# -- models ---------------------------------------------------------------------------------
def llama(shape: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {
        "70B": {
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
        },
        "405B": {
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_hidden_layers": 126,
            "num_attention_heads": 128,
        },
    }[shape]
    config = LlamaConfig(**sizes, num_key_value_heads=8, vocab_size=128256)
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16)


def flat(n: int) -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(*[nn.Linear(64, 64) for _ in range(n)])


class TiedHeads(nn.Module):
    """``n`` embeddings, each tied to its own output head registered far away."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.embeds = nn.ModuleList(nn.Embedding(8, 16) for _ in range(n))
        self.body = nn.Linear(16, 16)
        self.heads = nn.ModuleList(nn.Linear(16, 8, bias=False) for _ in range(n))
        for embed, head in zip(self.embeds, self.heads, strict=True):
            head.weight = embed.weight
        self.all_tied_weights_keys = {f"heads.{i}.weight": f"embeds.{i}.weight" for i in range(n)}


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16)
        self.head = nn.Linear(16, 8, bias=False)
        self.head.weight = self.embed.weight


class TiedPairs(nn.Module):
    """``n`` blocks, each an embedding with its tied head."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.pairs = nn.ModuleList(Pair() for _ in range(n))
        self.all_tied_weights_keys = {f"pairs.{i}.head.weight": f"pairs.{i}.embed.weight" for i in range(n)}


def tied_heads(n: int, distant: bool) -> nn.Module:
    with torch.device("meta"):
        return TiedHeads(n) if distant else TiedPairs(n)


def nbytes(model: nn.Module) -> int:
    return plan(model, {"cpu": 1 << 62}).total


# -- benchmarks -----------------------------------------------------------------------------
def bench_llama(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for shape in ("70B", "405B"):
        start = time.perf_counter()
        model = llama(shape)
        build = time.perf_counter() - start
        total = nbytes(model)
        budgets: dict[Any, int] = {i: total // 10 for i in range(8)}
        budgets.update(cpu=total // 10, disk=total)
        no_split = sorted(model._no_split_modules)
        row: dict[str, Any] = {"model": f"Llama-{shape}", "build_s": build}
        ours = npu(budgets)
        fns = dict(upstream(model, budgets, no_split))
        fns["accelreg"] = lambda m=model, b=ours: accelreg.plan_device_map(m, b)
        for fn in fns.values():  # warm up: first calls pay for imports and caches
            fn()
        row.update(interleaved_s(fns, repeat))
        row["ratio"] = row["accelreg"] / min(row["accelerate"], row["transformers"])
        rows.append(row)
    return rows


def bench_flat(sizes: list[int], upstream_up_to: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        start = time.perf_counter()
        model = flat(n)
        build = time.perf_counter() - start
        total = nbytes(model)
        budgets: dict[Any, int] = {i: total // 8 + 4 * 64 * 65 for i in range(8)}
        budgets["cpu"] = total
        row: dict[str, Any] = {"leaves": n, "build_s": build}
        ours = npu(budgets)
        row["accelreg"] = median_s(lambda m=model, b=ours: accelreg.plan_device_map(m, b), repeat)
        if n <= upstream_up_to:
            for name, fn in upstream(model, budgets, None).items():
                row[name] = median_s(fn, 1 if n > 2000 else repeat)
        rows.append(row)
    return rows


def bench_tied(n: int, repeat: int, distant: bool) -> dict[str, Any]:
    start = time.perf_counter()
    model = tied_heads(n, distant)
    build = time.perf_counter() - start
    total = nbytes(model)
    budgets: dict[Any, int] = {i: total // 4 for i in range(8)}
    budgets["cpu"] = total
    row: dict[str, Any] = {"heads": n, "layout": "far apart" if distant else "in pairs", "build_s": build}
    device_map = accelreg.plan_device_map(model, npu(budgets))
    accelreg.check_device_map(model, device_map, npu(budgets))
    row["accelreg"] = median_s(lambda: accelreg.plan_device_map(model, npu(budgets)), repeat)
    for name, fn in upstream(model, budgets, None).items():
        try:
            row[name] = median_s(fn, 1)
        except Exception as exc:  # noqa: BLE001 - upstream crashes on this layout; recorded
            row[name] = f"raises {type(exc).__name__}"
    return row


QUALITY_MODELS = {
    "GPT-2": ("GPT2LMHeadModel", {}),
    "Llama-2-7B shape, tied": ("LlamaForCausalLM", {"tie_word_embeddings": True}),
    "T5 (default)": ("T5ForConditionalGeneration", {}),
    "BART (default)": ("BartForConditionalGeneration", {}),
    "Whisper (default)": ("WhisperForConditionalGeneration", {}),
}


def _build(name: str, overrides: dict[str, Any]) -> nn.Module:
    import transformers

    cls = getattr(transformers, name)
    config = cls.config_class()
    for k, v in overrides.items():
        setattr(config, k, v)
    with torch.device("meta"):
        return cls(config)


def _upstream_balance(model: nn.Module, budgets: dict[Any, int]) -> tuple[float, int]:
    from transformers.integrations.accelerate import _get_device_map

    device_map = _get_device_map(model, "balanced", dict(budgets), None)
    loads = {u.place: u.used for u in _usage_of(model, npu(dict(device_map)))}
    used = [v for k, v in loads.items() if k.startswith("npu") and v]
    return (max(used) / (sum(used) / len(used)) if used else 0.0), len(used)


def _usage_of(model: nn.Module, int_map: dict[str, Any]):
    from accelreg.planner.check import loads
    from accelreg.planner.maps import expand
    from accelreg.planner.plan import PlaceUsage, analyze

    layout = analyze(model)[0]
    mapped = {k: (f"npu:{v}" if isinstance(v, int) else v) for k, v in int_map.items()}
    places = expand(layout, mapped)[0]
    return [PlaceUsage(p, n, None) for p, n in loads(layout, places).items()]


def bench_quality() -> list[dict[str, Any]]:
    rows = []
    extra = {"Llama-70B shape": llama("70B"), "Llama-405B shape": llama("405B")}
    models = {label: _build(*spec) for label, spec in QUALITY_MODELS.items()} | extra
    for label, model in models.items():
        total = nbytes(model)
        for n in (2, 4, 8):
            budgets: dict[Any, int] = {i: 2 * total for i in range(n)}
            result = plan(model, npu(budgets))
            q = quality(result)
            up_balance, up_used = _upstream_balance(model, budgets)
            rows.append(
                {
                    "model": label,
                    "devices": n,
                    "balance": q["balance"],
                    "bound": max(1.10, q["largest_unit"]),
                    "bound_glued": max(1.10, q["largest_glued"]),
                    "used": q["devices_used"],
                    "extra_boundaries": q["extra_boundaries"],
                    "upstream_balance": up_balance,
                    "upstream_used": up_used,
                }
            )
    return rows


LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers")


def _shrunk(name: str) -> nn.Module | None:
    import transformers

    cls = getattr(transformers, name, None)
    for shrink in (True, False):
        try:
            config = cls.config_class()
            if name == "ReformerModelWithLMHead":
                config.is_decoder = True
            if shrink:
                for c in [
                    config,
                    *(v for v in vars(config).values() if isinstance(v, transformers.PretrainedConfig)),
                ]:
                    for key in LAYER_KEYS:
                        if isinstance(getattr(c, key, None), int) and getattr(c, key) > 2:
                            setattr(c, key, 2)
            with torch.device("meta"):
                return cls._from_config(config)
        except Exception:  # noqa: BLE001 - unbuildable classes are skipped (docs/planner.md)
            continue
    return None


def scan() -> dict[str, Any]:
    """Every LM / pretraining class (two layers) under issue 4's four scenarios: how often each
    planner's map breaks a rule (``check_device_map``; upstream maps translated to ``npu:<i>``),
    raises, or (accelreg) reports no fit. Upstream always may use an unbounded disk; accelreg
    only where a budget says so, so upstream disk use without a disk budget counts as a violation
    here and is also counted separately."""
    from accelerate.utils import infer_auto_device_map as acc_infer
    from transformers.integrations.accelerate import _get_device_map
    from transformers.models.auto import modeling_auto as ma

    names = dict.fromkeys(
        n
        for mapping in (
            ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
            ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            ma.MODEL_FOR_PRETRAINING_MAPPING_NAMES,
        )
        for v in mapping.values()
        for n in (v if isinstance(v, (list, tuple)) else [v])
    )
    counts: dict[str, dict[str, int]] = {k: {} for k in ("accelreg", "accelerate", "transformers auto")}

    def bump(who: str, what: str) -> None:
        counts[who][what] = counts[who].get(what, 0) + 1

    for name in names:
        model = _shrunk(name)
        if model is None:
            continue
        total = nbytes(model)
        scenarios = [
            {0: 2 * total, "cpu": 2 * total},
            {**{i: total // 3 for i in range(4)}, "cpu": 2 * total},
            {**{i: total // 4 for i in range(8)}, "cpu": 2 * total},
            {0: total // 2, 1: total // 2, "cpu": total // 4},
        ]
        no_split = sorted(getattr(model, "_no_split_modules", None) or [])
        for budgets in scenarios:
            try:
                device_map = accelreg.plan_device_map(model, npu(budgets))
            except accelreg.DeviceMapError:
                bump("accelreg", "no fit")
            else:
                bad = _violations(model, device_map, npu(budgets))
                bump("accelreg", "invalid" if bad else "valid")
            for who, fn in (
                (
                    "accelerate",
                    lambda m=model, b=budgets, ns=no_split: acc_infer(
                        m, max_memory=dict(b), no_split_module_classes=ns
                    ),
                ),
                ("transformers auto", lambda m=model, b=budgets: _get_device_map(m, "auto", dict(b), None)),
            ):
                try:
                    upstream_map = fn()
                except Exception:  # noqa: BLE001 - counted
                    bump(who, "raises")
                    continue
                mapped = {k: (f"npu:{v}" if isinstance(v, int) else v) for k, v in upstream_map.items()}
                bad = _violations(model, mapped, npu(budgets))
                bump(who, "invalid" if bad else "valid")
                if "disk" in mapped.values():
                    bump(who, "uses disk without a budget")
                if any("exceeds" in v for v in bad):
                    bump(who, "over a budget (with headroom)")
                    if _overflows(model, mapped, npu(budgets)):
                        bump(who, "over a budget (weights alone)")
                if any("tied group" in v for v in bad):
                    bump(who, "tie split")
    return counts


def _overflows(model: nn.Module, device_map: dict[str, Any], budgets: dict[str, int]) -> bool:
    from accelreg.planner.check import loads
    from accelreg.planner.maps import expand
    from accelreg.planner.plan import analyze

    layout = analyze(model)[0]
    used = loads(layout, expand(layout, device_map)[0])
    return any(used[p] > budgets[p] for p in used if p in budgets)


def _violations(model: nn.Module, device_map: dict[str, Any], budgets: dict[str, int]) -> tuple[str, ...]:
    try:
        accelreg.check_device_map(model, device_map, budgets)
    except accelreg.DeviceMapError as exc:
        return exc.violations
    return ()


# -- output ---------------------------------------------------------------------------------
def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def markdown(results: dict[str, Any]) -> str:
    out = []
    out.append("Llama shapes on meta (bf16), 8 devices of 1/10 of the model + cpu 1/10 + disk:\n")
    out.append(
        "| model | build (caller) | accelerate | transformers | transformers auto | accelreg | accelreg / faster upstream |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results["llama"]:
        out.append(
            f"| {r['model']} | {ms(r['build_s'])} | {ms(r['accelerate'])} | {ms(r['transformers'])} | "
            f"{ms(r.get('transformers auto'))} | {ms(r['accelreg'])} | {r['ratio']:.2f}x |"
        )
    out.append("\nFlat model of N `Linear(64, 64)` leaves, 8 devices of 1/8 + cpu:\n")
    out.append("| leaves | build (caller) | accelreg | accelreg per 1k leaves | accelerate | transformers |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for r in results["flat"]:
        out.append(
            f"| {r['leaves']} | {ms(r['build_s'])} | {ms(r['accelreg'])} | {ms(r['accelreg'] / r['leaves'] * 1000)} | "
            f"{ms(r.get('accelerate'))} | {ms(r.get('transformers'))} |"
        )
    out.append(
        "\n4000 tied embedding/head pairs (in one block each, or heads far from their embeddings), 8 devices of 1/4 + cpu:\n"
    )
    out.append("| layout | build (caller) | accelreg | accelerate | transformers |")
    out.append("| --- | --- | --- | --- | --- |")
    for t in results["tied"]:
        cells = [v if isinstance(v, str) else ms(v) for v in (t["accelerate"], t["transformers"])]
        out.append(f"| {t['layout']} | {ms(t['build_s'])} | {ms(t['accelreg'])} | {cells[0]} | {cells[1]} |")
    out.append(
        "\nBalance of `balanced` (max device load / mean over devices used), budgets 2x the model each:\n"
    )
    out.append(
        "| model | devices | accelreg balance | bound: max(1.10, unit/mean) | bound with glued runs | devices used | extra boundaries | transformers balanced: balance, devices used |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results["quality"]:
        out.append(
            f"| {r['model']} | {r['devices']} | {r['balance']:.3f} | {r['bound']:.3f} | {r['bound_glued']:.3f} | "
            f"{r['used']}/{r['devices']} | {r['extra_boundaries']} | {r['upstream_balance']:.2f}, {r['upstream_used']}/{r['devices']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="upstream flat-model runs only up to 2k leaves")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--scan", action="store_true", help="only the every-architecture validity scan")
    args = parser.parse_args(argv)
    quiet()
    if args.scan:
        counts = scan()
        if args.json:
            print(json.dumps(counts, indent=2))
        else:
            print("| planner | " + " | ".join(sorted({k for c in counts.values() for k in c})) + " |")
            keys = sorted({k for c in counts.values() for k in c})
            print("| --- |" + " --- |" * len(keys))
            for who, c in counts.items():
                print(f"| {who} | " + " | ".join(str(c.get(k, 0)) for k in keys) + " |")
        return 0
    results = {
        "llama": bench_llama(args.repeat),
        "flat": bench_flat([1000, 2000, 5000, 10_000, 20_000], 2000 if args.quick else 5000, args.repeat),
        "tied": [bench_tied(4000, args.repeat, distant) for distant in (False, True)],
        "quality": bench_quality(),
    }
    print(json.dumps(results, indent=2) if args.json else markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
