"""Placement rules and their load hooks on real bitsandbytes layers (no DeepSpeed; CPU only).

The DeepSpeed round trips and the seed's Trainer run are in tests/deepspeed; the restore onto
an emulated ``npu:1`` is in tests/deepspeed/test_emu.py.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest
import torch

import accelreg
from accelreg import placement
from accelreg.builtin import bnb as bnb_rules
from accelreg.types import PlacementRule

bnb_modules = pytest.importorskip(
    "bitsandbytes.nn.modules", reason="bitsandbytes is a test dependency (accelreg[bnb])"
)
bnb_modules.has_avx512bf16 = lambda: False  # pin the CPU bf16 4-bit repacking off (read in __init__)
import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional  # noqa: E402

# bitsandbytes >= 0.49 repacks 4-bit weights for its CPU kernels; older releases (the release
# matrix runs 0.47) have neither the repacking nor the flag accelreg undoes
_convert_weight_packed_for_cpu = getattr(bitsandbytes.functional, "_convert_weight_packed_for_cpu", None)

UPSTREAM_8BIT = "Loading a quantized checkpoint into non-quantized Linear8bitLt is not supported"


# -- helpers ------------------------------------------------------------------------------
def lin8() -> Any:
    torch.manual_seed(0)
    fp = torch.nn.Linear(64, 64)
    m = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False)
    m.load_state_dict(fp.state_dict())
    return m.to("cpu")  # quantizes


def lin4(nested: bool = True, quant_type: str = "nf4") -> Any:
    torch.manual_seed(0)
    fp = torch.nn.Linear(64, 64)
    m = bnb.nn.Linear4bit(
        64, 64, compute_dtype=torch.float32, compress_statistics=nested, quant_type=quant_type
    )
    m.load_state_dict(fp.state_dict())
    return m.to("cpu")


X = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))


def forward(m: Any) -> Any:
    with torch.no_grad():
        return m(X)


def saved(m: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def corrupt8(m: Any) -> None:
    with torch.no_grad():
        m.weight.data.neg_()
        (m.weight.SCB if m.weight.SCB is not None else m.state.SCB).mul_(3.0)


def corrupt4(m: Any) -> None:
    qs = m.weight.quant_state
    with torch.no_grad():
        m.weight.data.bitwise_xor_(0x5A)
        if qs.absmax.dtype == torch.uint8:
            qs.absmax.add_(7)
        else:
            qs.absmax.mul_(3.0)
        if qs.state2 is not None:
            qs.state2.absmax.mul_(3.0)
            qs.offset.add_(1.0)


def our_pre_hooks(m: Any) -> list[Any]:
    return [
        h
        for h in m._load_state_dict_pre_hooks.values()
        if getattr(h, "hook", None) is placement.hooks._pre_hook
    ]


def rules_plugin(*rules: PlacementRule) -> Any:
    return types.SimpleNamespace(accelreg_placement_rules=accelreg.hookimpl(lambda backend: list(rules)))


# -- rule lookup --------------------------------------------------------------------------
def test_builtin_rules_for_every_backend() -> None:
    cpu8 = accelreg.placement_rule("cpu", "bnb_8bit")
    assert cpu8.travelling_keys == ("weight", "SCB", "weight_format") and cpu8.param == "weight"
    assert cpu8.may_live_on("cpu") and not cpu8.may_live_on("disk")
    npu8 = accelreg.placement_rule("npu", "int8")  # an alias; npu is registered (unavailable here)
    assert npu8.offload == frozenset() and not npu8.may_live_on("cpu") and npu8.may_live_on("npu:1")
    four = accelreg.placement_rule("cuda", "nf4")
    assert four.quant_method == "bnb_4bit" and "weight.quant_state." in four.travelling_keys
    assert four.module_classes[0] == "bitsandbytes.nn.modules.Linear4bit"


def test_unknown_method_backend_and_types() -> None:
    with pytest.raises(
        accelreg.PlacementError,
        match=r"no placement rule for 'gptq' on 'cpu'; known methods: bnb_4bit, bnb_8bit",
    ):
        accelreg.placement_rule("cpu", "gptq")
    with pytest.raises(
        accelreg.PlacementError, match=r"no backend named 'tpu' is registered; registered: .*cpu"
    ):
        accelreg.placement_rule("tpu", "bnb_8bit")
    with pytest.raises(TypeError):
        accelreg.placement_rule(0, "bnb_8bit")  # type: ignore[arg-type]


def _rule(backend: str, provider: str, **kw: Any) -> PlacementRule:
    return PlacementRule(
        backend=backend,
        quant_method="bnb_8bit",
        module_classes=bnb_rules.EIGHT_BIT_CLASSES,
        travelling_keys=("weight", "SCB", "weight_format"),
        provider=provider,
        **kw,
    )


def test_precedence_exact_backend_and_external_beat_builtin() -> None:
    builtin = accelreg.placement_rule("cpu", "bnb_8bit")
    assert builtin.provider == "accelreg" and builtin.backend == "*"
    accelreg.register(rules_plugin(_rule("*", "generic-ext")), "fakeplugin_generic")
    assert accelreg.placement_rule("cpu", "bnb_8bit").provider == "generic-ext"  # external beats built-in
    accelreg.register(rules_plugin(_rule("cpu", "exact-ext"), _rule("npu", "npu-ext")), "fakeplugin_exact")
    assert accelreg.placement_rule("cpu", "bnb_8bit").provider == "exact-ext"  # exact beats "*"
    assert accelreg.placement_rule("npu", "bnb_8bit").provider == "npu-ext"
    assert accelreg.placement_rule("cuda", "bnb_8bit").provider == "generic-ext"
    assert placement.rule_for_module(lin8(), "cpu").provider == "exact-ext"
    assert placement.rule_for_module(torch.nn.Linear(2, 2), "cpu") is None
    accelreg.reset()
    # registration order does not matter: exact beats "*" either way
    accelreg.register(rules_plugin(_rule("cpu", "exact-ext")), "fakeplugin_exact")
    accelreg.register(rules_plugin(_rule("*", "generic-ext")), "fakeplugin_generic")
    assert accelreg.placement_rule("cpu", "bnb_8bit").provider == "exact-ext"


def test_quantized_nbytes_match_real_bitsandbytes_tensors() -> None:
    rule8 = accelreg.placement_rule("cpu", "bnb_8bit")
    m = lin8()
    real8 = m.weight.numel() * m.weight.element_size() + m.weight.SCB.numel() * m.weight.SCB.element_size()
    assert rule8.quantized_nbytes((64, 64)) == real8 == 64 * 64 + 64 * 4
    rule4 = accelreg.placement_rule("cpu", "bnb_4bit")

    def nbytes4(layer: Any) -> int:
        qs = layer.weight.quant_state
        tensors = [layer.weight.data, qs.absmax, qs.code]
        if qs.state2 is not None:
            tensors += [qs.state2.absmax, qs.state2.code, qs.offset]
        return sum(t.numel() * t.element_size() for t in tensors)

    plain = lin4(nested=False)
    assert rule4.quantized_nbytes((64, 64)) == nbytes4(plain) == 2048 + 64 * 4 + 16 * 4  # exact
    big = bnb.nn.Linear4bit(1024, 1024, compute_dtype=torch.float32, compress_statistics=True).to("cpu")
    assert nbytes4(big) <= rule4.quantized_nbytes((1024, 1024))  # double quant: an upper bound


# -- grouping and target device ---------------------------------------------------------
def test_travelling_keys_cover_each_quantized_state_dict() -> None:
    for m, method in ((lin8(), "bnb_8bit"), (lin4(True), "bnb_4bit"), (lin4(False), "bnb_4bit")):
        rule = accelreg.placement_rule("cpu", method)
        keys = set(m.state_dict())
        travelling = {k for k in keys if placement.rules.travels(k, rule)}
        assert keys - travelling == {"bias"}, keys - travelling
    m = lin8()
    placement.attach(m)
    m.load_state_dict(saved(m))
    assert placement.load_events(m)[0]["keys"] == ["SCB", "weight", "weight_format"]


def test_target_device_is_the_live_weight_resolved_through_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import accelreg.resolution as resolution

    m = lin8()
    rule = placement.rule_for_module(m, "cpu")
    asked: list[Any] = []
    real = resolution.resolve
    monkeypatch.setattr(resolution, "resolve", lambda spec=None, **kw: asked.append(spec) or real(spec, **kw))
    assert placement.target_device(m, rule) == torch.device("cpu") and asked == [m.weight.device]
    # offloaded: the weight is on meta and accelerate's hook names the execution device
    meta = bnb.nn.Linear8bitLt(4, 4, has_fp16_weights=False, device="meta")
    with pytest.raises(accelreg.PlacementError, match="meta device and no offload hook"):
        placement.live_device(meta, rule)
    meta._hf_hook = types.SimpleNamespace(execution_device="cpu")
    assert placement.target_device(meta, rule) == torch.device("cpu")


# -- 8-bit --------------------------------------------------------------------------------
def test_scb_location_before_and_after_forward() -> None:
    m = lin8()
    assert m.weight.SCB is not None and m.state.SCB is None
    forward(m)
    assert m.weight.SCB is None and m.state.SCB is not None
    sd = saved(m)
    assert sorted(sd) == ["SCB", "bias", "weight", "weight_format"] and sd["weight_format"].item() == 0
    with pytest.raises(RuntimeError, match=UPSTREAM_8BIT):  # upstream, without hooks
        m.load_state_dict(sd)


@pytest.mark.parametrize("after_forward", [False, True], ids=["before_forward", "after_forward"])
def test_8bit_strict_load_is_bit_exact(after_forward: bool) -> None:
    m, y0 = lin8(), forward(lin8())  # an identical layer gives the reference output
    if after_forward:
        forward(m)
    sd = saved(m)
    placement.attach(m)
    assert (
        our_pre_hooks(m)
        and next(iter(m._load_state_dict_pre_hooks.values())).hook is placement.hooks._pre_hook
    )
    corrupt8(m)
    result = m.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    scb = m.weight.SCB if m.weight.SCB is not None else m.state.SCB
    assert torch.equal(m.weight.data, sd["weight"]) and torch.equal(scb, sd["SCB"])
    assert (m.weight.SCB is None) == after_forward  # the module's own layout is kept
    assert torch.equal(forward(m), y0)


def test_8bit_resyncs_a_stale_private_copy() -> None:
    m = lin8()
    forward(m)
    sd = saved(m)
    placement.attach(m)
    m.state.CB = m.state.CB.clone().neg_()  # no longer aliases weight.data
    m.load_state_dict(sd)
    assert m.state.CB.data_ptr() == m.weight.data.data_ptr() and torch.equal(m.state.CB, sd["weight"])
    assert placement.load_events(m)[-1]["cb_resync"] == "re-aliased to the loaded weight"


def test_8bit_weightless_checkpoint_keeps_weight_and_says_so() -> None:
    m = lin8()
    forward(m)
    sd = saved(m)
    weightless = {k: v for k, v in sd.items() if k != "weight"}
    up = lin8()  # upstream before forward: weight_format leaks as an unexpected key
    assert up.load_state_dict(weightless, strict=False).unexpected_keys == ["weight_format"]
    placement.attach(m)
    live = m.weight.data.clone()
    corrupt8(m)
    with torch.no_grad():
        m.weight.data.copy_(live)
    result = m.load_state_dict(weightless, strict=False)
    assert result.missing_keys == ["weight"] and result.unexpected_keys == []
    assert torch.equal(m.weight.data, live) and torch.equal(m.state.SCB, sd["SCB"])
    event = placement.load_events(m)[-1]
    assert (
        not event["param_in_checkpoint"]
        and "lacks" in event["note"]
        and "live value was kept" in event["note"]
    )
    corrupt8(m)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "weight"'):
        m.load_state_dict(weightless, strict=True)
    assert torch.equal(m.state.SCB, sd["SCB"])  # what the file carries was still copied in place


@pytest.mark.parametrize("fmt", [1, 2, 3])
@pytest.mark.parametrize("with_weight", [True, False])
def test_8bit_legacy_format_refused_clearly(fmt: int, with_weight: bool) -> None:
    m = lin8()
    forward(m)
    sd = saved(m)
    sd["weight_format"] = torch.tensor(fmt, dtype=torch.uint8)
    if not with_weight:
        del sd["weight"]
    placement.attach(m)
    before = m.state.SCB.clone()
    names = {1: "col32", 2: "col_turing", 3: "col_ampere"}
    with pytest.raises(accelreg.PlacementError, match=f"legacy '{names[fmt]}' layout .*row-major.*re-save"):
        m.load_state_dict(sd, strict=False)
    assert torch.equal(m.state.SCB, before)


def test_8bit_float_checkpoint_into_quantized_layer_refused() -> None:
    m = lin8()
    placement.attach(m)
    with pytest.raises(
        accelreg.PlacementError, match=r"checkpoint weight is torch\.float32 but the live layer is int8"
    ):
        m.load_state_dict(torch.nn.Linear(64, 64).state_dict())


def test_8bit_unquantized_layer_passes_through() -> None:
    m = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=True)  # trainable 8-bit: weights stay float
    placement.attach(m)
    sd = torch.nn.Linear(64, 64).state_dict()
    assert not m.load_state_dict(sd).missing_keys
    assert torch.equal(m.weight.data, sd["weight"])
    assert placement.load_events(m)[-1]["passthrough"]
    q = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False)  # not quantized yet (still on no device)
    placement.attach(q)
    with pytest.raises(
        accelreg.PlacementError, match="holds int8-quantized state but the live layer is not quantized"
    ):
        q.load_state_dict(saved(lin8()))


# -- 4-bit --------------------------------------------------------------------------------
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "plain"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "nonstrict"])
def test_4bit_restore_is_bit_exact(nested: bool, strict: bool) -> None:
    m = lin4(nested)
    y0 = forward(m)
    sd = saved(m)
    upstream = lin4(nested)
    corrupt4(upstream)
    if strict:
        with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*weight\.absmax"):
            upstream.load_state_dict(sd)
    else:  # upstream reports success and keeps the stale state
        assert upstream.load_state_dict(sd, strict=False).unexpected_keys
        assert not torch.equal(forward(upstream), y0)
    placement.attach(m)
    corrupt4(m)
    result = m.load_state_dict(sd, strict=strict)
    assert not result.missing_keys and not result.unexpected_keys
    after = m.state_dict()
    assert all(torch.equal(after[k], sd[k]) for k in sd), [k for k in sd if not torch.equal(after[k], sd[k])]
    assert m.quant_state is m.weight.quant_state
    assert torch.equal(forward(m), y0)
    assert placement.load_events(m)[-1]["quant_state_restored"]


def test_4bit_weightless_checkpoint() -> None:
    m = lin4()
    sd = saved(m)
    placement.attach(m)
    with torch.no_grad():
        m.weight.quant_state.absmax.add_(7)
    result = m.load_state_dict({k: v for k, v in sd.items() if k != "weight"}, strict=False)
    assert result.missing_keys == ["weight"] and not result.unexpected_keys
    assert torch.equal(m.weight.quant_state.absmax, sd["weight.absmax"])
    assert "lacks" in placement.load_events(m)[-1]["note"]


@pytest.mark.skipif(
    _convert_weight_packed_for_cpu is None, reason="this bitsandbytes has no CPU repacking of 4-bit weights"
)
def test_4bit_into_cpu_repacked_live_weight() -> None:
    m = lin4()
    y0 = forward(m)
    sd = saved(m)
    placement.attach(m)
    m.weight.data, qs = _convert_weight_packed_for_cpu(m.weight.data, m.weight.quant_state)
    m.weight.quant_state = m.quant_state = qs
    assert qs.packing_format_for_cpu and tuple(m.weight.shape) != tuple(sd["weight"].shape)
    m.load_state_dict(sd)
    assert torch.equal(m.weight.data, sd["weight"]) and not getattr(
        m.weight.quant_state, "packing_format_for_cpu", False
    )
    assert torch.equal(forward(m), y0)
    assert placement.load_events(m)[-1]["unpacked_cpu_format"]


def test_4bit_unsupported_states_refused() -> None:
    m = lin4()
    sd = saved(m)
    placement.attach(m)
    without_blob = {k: v for k, v in sd.items() if "quant_state." not in k}
    with pytest.raises(accelreg.PlacementError, match="unsupported 4-bit quantization state"):
        m.load_state_dict(without_blob)
    fp4 = lin4(True, "fp4")
    placement.attach(fp4)
    with pytest.raises(accelreg.PlacementError, match=r"quantization state is nf4 .*the live layer's fp4"):
        fp4.load_state_dict(sd)
    small = bnb.nn.Linear4bit(32, 32, compute_dtype=torch.float32).to("cpu")
    placement.attach(small)
    with pytest.raises(accelreg.PlacementError, match="does not match the live packed 4-bit weight"):
        small.load_state_dict(sd)


# -- no CUDA, attach/detach, events -----------------------------------------------------
def test_no_torch_cuda_call_during_a_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.overrides import TorchFunctionMode

    calls: list[str] = []
    trapped = 0
    for name, fn in vars(torch.cuda).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue

        def trap(*a: Any, __name: str = name, __fn: Any = fn, **k: Any) -> Any:
            calls.append(__name)
            return __fn(*a, **k)

        monkeypatch.setattr(torch.cuda, name, trap)
        trapped += 1
    assert trapped > 40

    class MoveLog(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.targets: set[str] = set()

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.to:
                self.targets.update(
                    str(a) for a in (*args[1:], *kwargs.values()) if isinstance(a, (torch.device, str))
                )
            return func(*args, **kwargs)

    for m in (lin8(), lin4(True), lin4(False)):
        forward(m)
        sd = saved(m)
        placement.attach(m)
        calls.clear()
        with MoveLog() as log:
            m.load_state_dict(sd)
        assert calls == [], f"torch.cuda called during the load: {calls}"
        assert log.targets <= {"cpu"}, log.targets


def test_attach_is_idempotent_and_detach_restores_upstream() -> None:
    model = torch.nn.Sequential(lin8(), torch.nn.ReLU(), lin4(), torch.nn.Linear(64, 2))
    assert placement.attach(model) == {"bnb_8bit": 1, "bnb_4bit": 1}
    assert placement.attach(model) == {"bnb_8bit": 1, "bnb_4bit": 1}
    assert len(our_pre_hooks(model[0])) == len(our_pre_hooks(model[2])) == 1
    assert our_pre_hooks(model[3]) == []
    assert "_accelreg_placement" not in dict(model[0].named_parameters())  # nothing registered as a param
    forward(model[0])
    sd = saved(model)
    model.load_state_dict(sd)
    assert placement.detach(model) == 2 and our_pre_hooks(model[0]) == []
    with pytest.raises(RuntimeError, match=UPSTREAM_8BIT):
        model.load_state_dict(sd)


def test_events_are_found_whoever_attached() -> None:
    inner = torch.nn.Sequential(lin8())
    placement.attach(inner)  # e.g. transformers' from_pretrained, on the base model
    outer = torch.nn.ModuleDict({"base": inner})  # e.g. peft's wrapper
    assert placement.attach(outer) == {"bnb_8bit": 1}
    forward(inner[0])
    outer.load_state_dict(saved(outer))
    events = placement.load_events(outer)
    assert [e["module"] for e in events] == ["base.0"] and placement.load_events(inner) == events
    assert placement.load_events(outer, clear=True) and placement.load_events(outer) == []


def test_a_plugin_rule_with_adapters_applies_at_load_time() -> None:
    m = lin8()
    forward(m)
    sd = saved(m)
    placement.attach(m)  # built-in rule at attach time
    seen: list[tuple[str, Any]] = []
    builtin = accelreg.placement_rule("cpu", "bnb_8bit")

    def before(
        module: Any, state_dict: dict[str, Any], prefix: str, device: Any, event: dict[str, Any]
    ) -> None:
        seen.append(("before", sorted(state_dict)))
        builtin.before_load(module, state_dict, prefix, device, event)

    def after(module: Any, event: dict[str, Any]) -> None:
        seen.append(("after", event["device"]))
        builtin.after_load(module, event)

    accelreg.register(
        rules_plugin(_rule("cpu", "vendor", before_load=before, after_load=after)), "fakeplugin_vendor"
    )
    m.load_state_dict(sd)
    assert seen == [("before", ["SCB", "bias", "weight", "weight_format"]), ("after", "cpu")]
    assert not m.state_dict().keys() - sd.keys() and m.weight.SCB is None


def test_module_classes_take_a_dotted_path_or_a_bare_class_name() -> None:
    cls = bnb.nn.Linear8bitLt
    assert cls.__module__ == "bitsandbytes.nn.modules"
    for entry in (
        "bitsandbytes.nn.modules.Linear8bitLt",  # where it is defined
        "bitsandbytes.nn.Linear8bitLt",  # where users import it from
        "Linear8bitLt",  # bare class name
        "torch.nn.Module",  # a base class
    ):
        assert placement.names_class((entry,), cls), entry
    for entry in ("Linear4bit", "torch.nn.Linear8bitLt", "nn.modules.Linear8bitLt", "Embedding"):
        assert not placement.names_class((entry,), cls), entry
    bare = types.SimpleNamespace(
        accelreg_placement_rules=accelreg.hookimpl(
            lambda backend: [
                PlacementRule(
                    backend="*", quant_method="acme_int8", module_classes=("Linear8bitLt",), provider="t"
                )
            ]
        )
    )
    accelreg.register(bare, name="bare-name-rules")
    rule = placement.rule_for_module(lin8(), "cpu")
    assert rule is not None and rule.quant_method == "acme_int8"  # external beats the built-in
