"""Real architectures on the meta device, under several budget scenarios: every map is valid.

Named architectures (GPT-2, T5, BART, Llama with tied embeddings, ALBERT, Whisper) run with their
default configs; the slow loop builds every causal-LM, seq2seq-LM, masked-LM and pretraining
class of the installed transformers (at most two layers, where the config allows), under issue
4's scenarios and issue 12's offload scenarios, and compares what the accelerators hold with the
exact optimum stored in ``tests/data/planner_optimum.json`` (the MILP of
test_planner_reference.py; ``python benchmarks/bench_planner_residency.py --write-reference
tests/data/planner_optimum.json`` writes it again).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

import accelreg
from accelreg.planner import plan
from accelreg.planner.plan import analyze
from accelreg.planner.report import quality

from ._planner_support import build_class, quiet, violations

REFERENCE = Path(__file__).parent / "data" / "planner_optimum.json"

NAMED = {
    "GPT2LMHeadModel": {},
    "T5ForConditionalGeneration": {},
    "BartForConditionalGeneration": {},
    "LlamaForCausalLM": {"tie_word_embeddings": True},
    "AlbertForMaskedLM": {},
    "WhisperForConditionalGeneration": {},
}

#: Classes transformers 5.25 (the reference's release) cannot build from their default config on meta.
KNOWN_UNBUILDABLE = {
    "CohereCompassForCausalLM": "KeyError 'full_attention': default layer_types name an attention kind it lacks",
    "DbrxForCausalLM": "DbrxAttentionConfig has no rope_theta",
    "Dots1ForCausalLM": "default config leaves a dimension unset (torch.empty(None))",
    "Gemma3nForConditionalGeneration": "its vision tower needs timm, which is not installed",
    "Gemma4AssistantForCausalLM": "default config fails its own validator (hidden_size_per_layer_input must be 0)",
    "HunYuanDenseV1ForCausalLM": "default config leaves rope settings unset (None ** float)",
    "HunYuanMoEV1ForCausalLM": "default config leaves rope settings unset (None ** float)",
    "Lfm2MoeForCausalLM": "default config leaves layer_types unset (None is not subscriptable)",
    "MinistralForCausalLM": "default config leaves rope settings unset (None ** float)",
    "NemotronForCausalLM": "default config leaves head_dim unset (int // None)",
    "EsmForMaskedLM": "default config has vocab_size=None",
    "HieraForPreTraining": "default config leaves a size unset (torch.empty(None))",
}


def scenarios(total: int) -> dict[str, dict[str, int]]:
    """The four budget scenarios of issue 4, relative to the model's size."""
    return {
        "one big device": {"npu:0": 2 * total, "cpu": 2 * total},
        "4 devices of a third": {**{f"npu:{i}": total // 3 for i in range(4)}, "cpu": 2 * total},
        "8 devices of a quarter": {**{f"npu:{i}": total // 4 for i in range(8)}, "cpu": 2 * total},
        "2 devices of half + small cpu": {"npu:0": total // 2, "npu:1": total // 2, "cpu": total // 4},
    }


def offload_scenarios(total: int) -> dict[str, dict[str, int]]:
    """Issue 12's scenarios, where something must be offloaded."""
    return {
        "4 x size/5 + cpu": {**{f"npu:{i}": total // 5 for i in range(4)}, "cpu": 2 * total},
        "8 x size/10 + cpu": {**{f"npu:{i}": total // 10 for i in range(8)}, "cpu": 2 * total},
        "2 x size/3 + cpu size/4 + disk": {
            "npu:0": total // 3,
            "npu:1": total // 3,
            "cpu": total // 4,
            "disk": 10**13,
        },
    }


@functools.cache
def reference_file() -> dict:
    """``{"transformers": the release it was written on, "classes": {class: {"total": bytes,
    "optimum": {scenario: bytes or None}}}}``."""
    return json.loads(REFERENCE.read_text())


def reference() -> dict:
    """The stored exact optima per class."""
    return reference_file()["classes"]


def certain_no_fit(layout, budgets: dict[str, int]) -> str | None:
    """A proof that no valid map exists (or ``None``), from a relaxation of the rules: the largest
    units are placed exactly (every assignment is tried), the rest is treated as fluid that may
    fill any leftover room; only offloaded large units need headroom, on the best accelerator.
    A relaxation accepts every valid map, so "the relaxation has no solution" proves no fit."""
    import itertools
    import math

    if layout.total > sum(budgets.values()):
        return "the model is larger than all budgets together"
    places = list(budgets)
    accelerators = [p for p in places if p not in ("cpu", "disk")]
    order = sorted(range(len(layout.unit_size)), key=lambda u: -layout.unit_size[u])
    width = max(1, int(math.log(200_000) / math.log(max(len(places), 2))))
    big, fluid = order[:width], sum(layout.unit_size[u] for u in order[width:])
    for choice in itertools.product(places, repeat=len(big)):
        load = dict.fromkeys(places, 0)
        for u, place in zip(big, choice, strict=True):
            load[place] += layout.unit_size[u]
        if any(load[p] > budgets[p] for p in places):
            continue
        headroom = max(
            (layout.unit_layer[u] for u, p in zip(big, choice, strict=True) if p in ("cpu", "disk")),
            default=0,
        )
        spare = sum(budgets[p] - load[p] for p in places)
        if headroom:
            fits = [budgets[a] - load[a] - headroom for a in accelerators if budgets[a] - load[a] >= headroom]
            if not fits and any(load[a] for a in accelerators):
                continue
            if fits:
                spare -= headroom
        if fluid <= spare:
            return None
    return f"no assignment of the {len(big)} largest units leaves room for the rest"


def check_plan(
    model, budgets: dict[str, int], name: str, scenario: str, best: int | None = ..., at_least: bool = False
) -> dict | None:
    """Plan ``model`` under ``budgets``; assert the map is valid, or that no map can exist.
    With ``best`` (the exact optimum, ``None``: no valid map), assert the accelerators hold
    within 0.98 of it; with ``at_least``, ``best`` is only what a known valid map holds
    (``None``: no valid map is known, nor excluded), which the plan must reach within 0.98."""
    try:
        result = plan(model, budgets)
    except accelreg.DeviceMapError as exc:
        assert "search limit" not in str(exc), f"{name} / {scenario}: the search gave up: {exc}"
        if best is not ...:
            assert best is None, (
                f"{name} / {scenario}: planner found no fit, but {best} bytes can stay on accelerators"
            )
            return None
        layout = analyze(model, backend="npu")[0]
        reason = certain_no_fit(layout, budgets)
        if reason is None:
            from .test_planner_reference import optimum, problem_of

            pytest.importorskip("scipy", reason="the exact reference is a scipy MILP (in the test extra)")
            if optimum(problem_of(model, budgets)) is None:
                reason = "the exact reference (MILP) finds no valid map"
        assert reason is not None, (
            f"{name} / {scenario}: planner found no fit, but none is proven: {exc.violations}"
        )
        return None
    found = violations(model, result.device_map, budgets)
    assert found == (), f"{name} / {scenario}: {found}"
    assert set(result.device_map.values()) <= set(budgets)
    if best is ... or (at_least and best is None):
        return quality(result)
    assert best is not None, f"{name} / {scenario}: the reference finds no valid map, the planner did"
    ratio = result.resident / best if best > 1 else 1.0
    if at_least:
        ratio = min(ratio, 1.0)
    # the reference is exact to about a millionth (the solver's tolerances)
    assert 0.98 <= ratio <= 1 + 1e-6, f"{name} / {scenario}: {result.resident} of {best} bytes ({ratio:.4f})"
    return quality(result)


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    quiet()


def best_bottleneck(sizes: list[int], blocks: list[bool], caps: list[int]) -> tuple[int, int]:
    """``(smallest possible largest load, number of pieces)`` over contiguous plans that cut only
    next to a no-split block (dynamic programming; independent of the planner's search)."""
    n = len(sizes)
    allowed = [True] * (n + 1)
    if any(blocks):
        allowed = [i in (0, n) or blocks[i - 1] or blocks[i] for i in range(n + 1)]
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    # best[d][i]: smallest largest load placing sizes[:i] on the first d devices
    best = [[inf] * (n + 1) for _ in range(len(caps) + 1)]
    best[0][0] = 0
    for d in range(1, len(caps) + 1):
        for i in range(n + 1):
            if not allowed[i]:
                continue
            for j in range(i + 1):
                load = prefix[i] - prefix[j]
                if allowed[j] and load <= caps[d - 1] and best[d - 1][j] < inf:
                    best[d][i] = min(best[d][i], max(best[d - 1][j], load))
    pieces = sum(allowed[1:])
    return best[len(caps)][n], pieces


@pytest.mark.parametrize("name", list(NAMED))
def test_named_architectures_under_every_scenario(name):
    model = build_class(name, small=False, **NAMED[name])
    layout = analyze(model)[0]
    for scenario, budgets in scenarios(layout.total).items():
        q = check_plan(model, budgets, name, scenario)
        if q is None or not scenario.startswith(("4 devices", "8 devices")):
            continue
        result = plan(model, budgets)
        loads = [u.used for u in result.places if u.place.startswith("npu")]
        if any(u.used for u in result.places if u.place in ("cpu", "disk")):
            continue
        caps = [v for k, v in budgets.items() if k.startswith("npu")]
        optimum, pieces = best_bottleneck(layout.unit_size, layout.unit_block, caps)
        assert max(loads) == optimum, (name, scenario, q)  # the best contiguous balance
        assert q["devices_used"] == min(len(caps), pieces), (name, scenario, q)


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_decoders_use_every_device_with_one_extra_boundary_for_the_tied_head(name):
    model = build_class(name, small=False, **NAMED[name])
    layout = analyze(model)[0]
    for n in (2, 4, 8):
        caps = [2 * layout.total] * n
        result = plan(model, {f"npu:{i}": c for i, c in enumerate(caps)})
        q = quality(result)
        assert q["devices_used"] == n, q
        assert q["extra_boundaries"] <= 1, q
        optimum, _ = best_bottleneck(layout.unit_size, layout.unit_block, caps)
        assert max(u.used for u in result.places) == optimum, q  # no contiguous plan is more even


def test_tied_t5_embeddings_stay_together():
    model = build_class("T5ForConditionalGeneration", small=False)
    total = analyze(model)[0].total
    result = plan(model, {f"npu:{i}": total // 3 for i in range(4)})
    places = {k: v for k, v in result.device_map.items()}
    tied = {"shared", "encoder.embed_tokens", "decoder.embed_tokens", "lm_head"}
    assert tied <= set(places) and len({places[k] for k in tied}) == 1


def mapping_classes() -> list[str]:
    from transformers.models.auto import modeling_auto as ma

    names: dict[str, None] = {}
    for mapping in (
        ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        ma.MODEL_FOR_PRETRAINING_MAPPING_NAMES,
    ):
        for cls in mapping.values():
            for name in cls if isinstance(cls, (list, tuple)) else [cls]:
                names[name] = None
    return list(names)


@pytest.mark.slow
def test_every_lm_and_pretraining_class_plans_validly():
    """On the release the reference was written on, every class must be in it, and the
    unbuildable ones are exactly the documented list. On another release (a fresh install takes
    the newest) a class that is new or changed size has no stored optimum: its plans are checked
    for validity alone (a refusal must be provably right), and the rest against their optima."""
    import transformers

    same_release = transformers.__version__ == reference_file()["transformers"]
    unbuildable: dict[str, str] = {}
    planned, unreferenced = 0, []
    for name in mapping_classes():
        if not hasattr(transformers, name):
            unbuildable[name] = "not exported by transformers"
            continue
        try:
            model = build_class(name)
        except Exception as exc:  # noqa: BLE001 - recorded and compared with the documented list
            unbuildable[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        total = analyze(model)[0].total
        stored = reference().get(name)
        budgets_by_scenario = {**scenarios(total), **offload_scenarios(total)}
        planned += 1
        if stored is None or stored["total"] != total:
            assert not same_release, (
                f"{name}: tests/data/planner_optimum.json is stale (size {total}, stored "
                f"{stored and stored['total']}); run python benchmarks/bench_planner_residency.py "
                "--write-reference tests/data/planner_optimum.json"
            )
            unreferenced.append(name)
            for scenario, budgets in budgets_by_scenario.items():
                check_plan(model, budgets, name, scenario)
            continue
        for scenario, budgets in budgets_by_scenario.items():
            if scenario in stored.get("open", {}):  # the optimum lies between a valid map and a bound
                check_plan(model, budgets, name, scenario, stored["open"][scenario], at_least=True)
                continue
            check_plan(model, budgets, name, scenario, stored["optimum"][scenario])
    assert planned > 250
    assert len(unreferenced) < planned / 2, f"the reference is far behind this release: {unreferenced}"
    if same_release:
        assert set(unbuildable) == set(KNOWN_UNBUILDABLE), (
            "update KNOWN_UNBUILDABLE and docs/planner.md: "
            f"newly failing {sorted(set(unbuildable) - set(KNOWN_UNBUILDABLE))} -> "
            f"{ {k: unbuildable[k] for k in set(unbuildable) - set(KNOWN_UNBUILDABLE)} }, "
            f"now building {sorted(set(KNOWN_UNBUILDABLE) - set(unbuildable))}"
        )
