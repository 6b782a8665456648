"""The upstream failure classes of issue 4, each as a canary and the planner's answer.

Each test first shows that accelerate 1.15's and/or transformers 5.24's ``infer_auto_device_map``
(or the ``balanced`` pipeline around it) still fails the case today; if that ever stops, the
canary fails with "upstream changed" so the comparison can be revisited. Then the same model
and budgets go through accelreg, whose map must pass ``check_device_map``.

Upstream takes int device keys; :func:`npu_budgets` / :func:`npu_map` translate them to the
fully qualified ``npu:<i>`` places accelreg plans for.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import accelreg
from accelreg.planner import plan

from ._planner_support import (
    build_class,
    model_type,
    npu_budgets,
    npu_map,
    quiet,
    total_bytes,
    violations,
)
from .test_planner import Stack


@pytest.fixture(autouse=True)
def _quiet():
    quiet()


def acc_infer(model, budgets, no_split=None):
    from accelerate.utils import infer_auto_device_map

    return infer_auto_device_map(model, max_memory=dict(budgets), no_split_module_classes=no_split)


def tf_infer(model, budgets, no_split=None):
    from transformers.integrations.accelerate import infer_auto_device_map

    if not hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}
    return infer_auto_device_map(model, max_memory=dict(budgets), no_split_module_classes=no_split)


def raises(fn, *args, **kw) -> BaseException | None:
    try:
        fn(*args, **kw)
    except Exception as exc:  # noqa: BLE001 - the canary records whatever upstream raises
        return exc
    return None


def changed(what: str) -> str:
    return f"upstream changed: {what}; revisit this canary and docs/planner.md"


def ours_valid(model, int_budgets, **kw) -> dict[str, str]:
    budgets = npu_budgets(int_budgets)
    device_map = accelreg.plan_device_map(model, budgets, **kw)
    assert violations(model, device_map, budgets, **{k: v for k, v in kw.items() if k != "strategy"}) == ()
    return device_map


def place(device_map, name):
    (key,) = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
    return device_map[key]


def embed_head(middle: str) -> nn.Module:
    with torch.device("meta"):
        model = nn.Module()
        model.embed = nn.Embedding(100, 16)
        setattr(model, middle, nn.Linear(16, 100, bias=False))
        model.lm_head = nn.Linear(16, 100, bias=False)
    model.lm_head.weight = model.embed.weight
    model.all_tied_weights_keys = {"lm_head.weight": "embed.weight"}
    return model


def test_tie_membership_by_substring():
    """A module called ``head`` is taken for part of the tie ``lm_head.weight``: "head." is a
    substring of "lm_head.weight."; the untied ``head`` then looks for a partner already placed."""
    budgets = {0: 7000, 1: 7000, "cpu": 10**6}
    for infer in (acc_infer, tf_infer):
        err = raises(infer, embed_head("head"), budgets)
        assert isinstance(err, IndexError), changed(
            f"{infer.__name__} handles a module named 'head' ({err!r})"
        )
        assert raises(infer, embed_head("proj"), budgets) is None, changed(
            "renaming head to proj no longer helps"
        )
    model = embed_head("head")
    device_map = ours_valid(model, budgets)
    assert place(device_map, "embed.weight") == place(device_map, "lm_head.weight")


def test_two_tie_groups_sharing_one_module():
    def build():
        with torch.device("meta"):
            model = nn.Module()
            model.a, model.mid, model.b, model.dec = (nn.Linear(32, 32) for _ in range(4))
        model.dec.weight = model.a.weight
        model.dec.bias = model.b.bias
        model.all_tied_weights_keys = {"dec.weight": "a.weight", "dec.bias": "b.bias"}
        return model

    budgets = {0: 4400, 1: 4400, "cpu": 10**6}
    for infer in (acc_infer, tf_infer):
        err = raises(infer, build(), budgets)
        assert isinstance(err, IndexError), changed(
            f"{infer.__name__} handles dec tied to both a and b ({err!r})"
        )
    model = build()
    device_map = ours_valid(model, budgets)
    assert len({place(device_map, n) for n in ("a.weight", "b.bias", "dec.weight", "dec.bias")}) == 1


def test_a_tied_partner_already_placed_on_a_real_architecture():
    """CamembertForCausalLM (XLM-R alike): accelerate crashes, transformers overflows device 0."""
    model = build_class("CamembertForCausalLM")
    total = total_bytes(model)
    budgets = {**{i: total // 3 for i in range(4)}, "cpu": 2 * total}
    no_split = list(model._no_split_modules)
    err = raises(acc_infer, model, budgets, no_split)
    assert isinstance(err, IndexError), changed(f"accelerate plans CamembertForCausalLM ({err!r})")
    from transformers.integrations.accelerate import infer_auto_device_map

    upstream = infer_auto_device_map(
        model, max_memory=dict(budgets), no_split_module_classes=model._no_split_modules
    )
    found = violations(model, npu_map(upstream), npu_budgets(budgets))
    assert any("npu:0" in v and "exceeds" in v for v in found), changed(
        f"transformers' map is within budget: {found}"
    )
    ours_valid(model, budgets)


def test_tied_targets_registered_before_their_source_are_counted_zero_times():
    with torch.device("meta"):
        model = nn.Module()
        model.head = nn.Linear(16, 100, bias=False)
        model.body = nn.Linear(16, 16)
        model.embed = nn.Embedding(100, 16)
    model.embed.weight = model.head.weight
    model.all_tied_weights_keys = {"head.weight": "embed.weight"}
    budgets = {0: 7000, 1: 3000, "cpu": 10**6}
    upstream = tf_infer(model, budgets)
    assert upstream == {"": 0}, changed(f"transformers now places the model as {upstream}")
    found = violations(model, npu_map(upstream), npu_budgets(budgets))
    assert any("npu:0" in v and "exceeds" in v for v in found), changed("the tied weight is counted now")
    result = plan(model, npu_budgets(budgets))
    assert result.total == 4 * (1600 + 16 * 16 + 16)
    ours_valid(model, budgets)


class OwnBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.empty(64))
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)


def test_a_split_modules_own_buffers_are_left_unmapped():
    from accelerate.utils.modeling import check_device_map

    with torch.device("meta"):
        model = nn.Sequential(OwnBuffer(), nn.Linear(16, 16))
    budgets = {0: 1400, 1: 1400, "cpu": 10**6}
    for infer in (acc_infer, tf_infer):
        upstream = infer(model, budgets)
        found = violations(model, npu_map(upstream), npu_budgets(budgets))
        assert any("0.table" in v and "no key" in v for v in found), changed(f"{infer.__name__} maps 0.table")
        err = raises(check_device_map, model, upstream)
        assert isinstance(err, ValueError) and "0.table" in str(err), changed(
            "accelerate accepts its own map"
        )
    device_map = ours_valid(model, budgets)
    assert "0" in device_map or "0.table" in device_map


def test_balanced_low_0_with_device_ids_1_2_3():
    from accelerate.utils import get_balanced_memory as acc_balanced
    from transformers.integrations.accelerate import get_balanced_memory as tf_balanced

    model = model_type("gpt2")
    budgets = {1: 10**9, 2: 10**9, 3: 10**9, "cpu": 10**10}
    for balanced in (acc_balanced, tf_balanced):
        err = raises(balanced, model, dict(budgets), low_zero=True)
        assert isinstance(err, KeyError), changed(f"{balanced.__module__} handles ids 1..3 ({err!r})")
    device_map = ours_valid(model, budgets, strategy="balanced_low_0")
    loads = collections.Counter()
    for usage in plan(model, npu_budgets(budgets), strategy="balanced_low_0").places:
        loads[usage.place] = usage.used
    assert loads["npu:1"] < min(loads["npu:2"], loads["npu:3"])  # the first device is spared
    assert set(device_map.values()) <= {"npu:1", "npu:2", "npu:3"}


def test_a_disk_budget_key_crashes_balanced():
    from accelerate.utils import get_balanced_memory

    model = model_type("gpt2")
    budgets = {0: 10**9, 1: 10**9, "cpu": 10**10, "disk": 10**11}
    err = raises(get_balanced_memory, model, dict(budgets))
    assert isinstance(err, RuntimeError) and "disk" in str(err), changed(
        f"accelerate balances with a disk key ({err!r})"
    )
    device_map = ours_valid(model, budgets)
    assert set(device_map.values()) == {"npu:0", "npu:1"}


def test_a_tied_group_bigger_than_any_device_sends_everything_after_it_to_cpu():
    """Blocks 1, 3 and 4 share a weight: one unit bigger than a device (each layer fits)."""
    with torch.device("meta"):
        model = Stack(n=6, tie=False)
    model.blocks[3].fc1.weight = model.blocks[4].fc1.weight = model.blocks[1].fc1.weight
    model.all_tied_weights_keys = {
        "blocks.3.fc1.weight": "blocks.1.fc1.weight",
        "blocks.4.fc1.weight": "blocks.1.fc1.weight",
    }
    budgets = {0: 1200, 1: 1200, 2: 1200, "cpu": 10**6}
    after = ["blocks.2", "blocks.5", "norm", "head"]
    for infer in (acc_infer, tf_infer):
        upstream = infer(model, budgets, ["Block"])
        assert all(upstream[k] == "cpu" for k in after), changed(f"{infer.__name__}: {dict(upstream)}")
        assert 2 not in upstream.values(), changed(f"{infer.__name__} uses the third device")
    device_map = ours_valid(model, budgets)
    assert all(place(device_map, k + ".weight").startswith("npu") for k in after)
    assert place(device_map, "blocks.1.fc1.weight") == "cpu"


def test_balanced_on_8_large_devices_uses_them_all():
    from accelerate.utils import get_balanced_memory
    from transformers.integrations.accelerate import _get_device_map

    model = model_type("gpt2")
    budgets = {**{i: 80 * 10**9 for i in range(8)}, "cpu": 10**11}
    no_split = list(model._no_split_modules)
    balanced = get_balanced_memory(model, dict(budgets), no_split_module_classes=no_split)
    upstream = acc_infer(model, balanced, no_split)
    assert len(set(upstream.values())) == 1, changed(f"accelerate's balanced spreads GPT-2: {dict(upstream)}")
    auto = _get_device_map(model, "balanced", dict(budgets), None)
    assert len(set(auto.values())) < 8, changed("transformers' balanced uses all 8 devices")
    device_map = ours_valid(model, budgets)
    assert set(device_map.values()) == {f"npu:{i}" for i in range(8)}
