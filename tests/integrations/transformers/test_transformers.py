"""transformers through accelreg's integration, on this CPU machine, against the real library.

* A seam matching no adapter is skipped alone with one warning; strict mode raises at
  ``enable()`` and at ``install()`` and patches nothing.
* Behaviour through ``accelreg.install()``: device_map ints/strings, ``"auto"`` planned by
  accelreg, user maps validated, longest-prefix expansion, disk offload, bitsandbytes 8-/4-bit
  loads with placement hooks and the registry's default device map; the kernels library.
* The patch-free path: ``accelreg.device_map_for`` plans without patching anything.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import replace

import pytest
import torch

import accelreg
import accelreg.integrations as integrations
from accelreg import DeviceError, DeviceMapError, importwatch
from accelreg.errors import IntegrationError, PlacementError
from accelreg.integrations._machinery import seams as _seams
from accelreg.plugin import PlacementRule

from ..._fakes import plugin, spec
from .._support import (
    GPT2_KW,
    NAMES,
    Snapshot,
    _covered,
    _gpt2,
    _gpt2_map,
    _integration,
    _needs_disk_offload,
    needs_check_and_set,
)


def _unmatched_bnb4(monkeypatch):
    """transformers with a Bnb4BitHfQuantizer.update_device_map of a shape no adapter knows."""
    integ = _integration("transformers")
    seams = list(integ.seams)
    index = next(i for i, s in enumerate(seams) if s.name == "Bnb4BitHfQuantizer.update_device_map")
    assert 0 < index < len(seams) - 1  # seams before and after it still match
    seams[index] = replace(
        seams[index], adapters=tuple(replace(a, shapes=("0" * 16,)) for a in seams[index].adapters)
    )
    monkeypatch.setattr(integ, "seams", seams)
    return integ


def test_a_seam_matching_no_adapter_is_skipped_alone_with_one_warning(monkeypatch):
    integ = _unmatched_bnb4(monkeypatch)
    import transformers.modeling_utils as mu
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    stock4 = inspect.getattr_static(Bnb4BitHfQuantizer, "update_device_map")
    snap = Snapshot()
    with pytest.warns(integrations.IntegrationWarning) as caught:
        integ.enable()
    (warning,) = [w for w in caught if issubclass(w.category, integrations.IntegrationWarning)]
    message = str(warning.message)
    assert "Bnb4BitHfQuantizer.update_device_map skipped" in message and "0000000000000000" in message
    assert "lost: default device of a 4-bit load from the registry" in message
    assert "accelreg.device_map_for" in message  # the patch-free alternative
    assert integ.enabled
    assert inspect.getattr_static(Bnb4BitHfQuantizer, "update_device_map") is stock4  # skipped alone
    assert _seams.original(inspect.getattr_static(Bnb8BitHfQuantizer, "update_device_map")) is not None
    assert _seams.original(mu._get_device_map) is not mu._get_device_map  # the rest is on
    status = integ.status()
    assert status["skipped"] == [
        "transformers.quantizers.quantizer_bnb_4bit.Bnb4BitHfQuantizer.update_device_map"
    ]
    assert f"1 of {len(integ.seams)} seams match no adapter" in status["note"]
    integ.disable()
    assert snap.diff() == []


def test_strict_mode_raises_at_enable_and_patches_nothing(monkeypatch, strict):
    integ = _unmatched_bnb4(monkeypatch)
    snap = Snapshot()
    with pytest.raises(
        IntegrationError, match=r"match no adapter \(strict mode: nothing was patched\)"
    ) as info:
        integ.enable()
    assert "Bnb4BitHfQuantizer.update_device_map has shape" in str(info.value)
    assert not integ.enabled
    assert snap.diff() == []


def test_strict_install_raises_at_the_call_and_leaves_nothing_enabled(monkeypatch, strict):
    """accelerate comes first in install()'s order and is enabled, then undone."""
    _unmatched_bnb4(monkeypatch)
    snap = Snapshot()
    with pytest.raises(IntegrationError, match=r"Bnb4BitHfQuantizer\.update_device_map"):
        accelreg.install()
    assert not any(_integration(n).enabled for n in NAMES)
    assert not any(importwatch.pending(t) for t in integrations.table.BUILTIN.values())
    assert snap.diff() == []


def test_hub_kernels_support_asks_the_kernels_library():
    from accelreg.integrations.transformers import hub_kernels_support

    try:
        import kernels  # noqa: F401
    except ImportError:  # not installed, or not importable with this huggingface_hub
        assert hub_kernels_support("cuda") is False  # nothing to run kernels with
        return
    assert hub_kernels_support("cuda") is True  # every kernels release lists cuda (0.10 has no cpu)
    assert hub_kernels_support("accelreg-no-such-type") is False


@pytest.mark.parametrize("device_map", [0, {"": 0}], ids=["int", "dict-int"])
def test_int_device_map_without_an_accelerator_is_a_device_error(models, installed, device_map):
    with pytest.raises(DeviceError) as info:
        _gpt2(models, device_map=device_map)
    message = str(info.value)
    assert "no accelerator is available" in message and "available: cpu" in message
    assert "cuda:0" not in message


def test_cuda_device_map_on_a_cpu_machine_is_refused(models, installed):
    with pytest.raises(DeviceError, match=r"cuda is not available .*; available: cpu$"):
        _gpt2(models, device_map="cuda")


@needs_check_and_set
def test_cuda_is_refused_not_remapped_when_another_backend_is_current(installed, monkeypatch):
    """Two scripted hpu devices are current: ``"cuda"`` is an error naming them (the user
    asked for a backend that is not here); ints and LOCAL_RANK resolve on hpu."""
    import transformers.modeling_utils as mu

    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("hpu", 2, priority=100)), "fakeplugin_hpu")
    for device_map in ("cuda", "cuda:0", torch.device("cuda", 0), {"": "cuda"}):
        with pytest.raises(DeviceError, match=r"cuda is not available .*available: hpu:0, hpu:1, cpu"):
            mu.check_and_set_device_map(device_map)
    assert mu.check_and_set_device_map(0) == {"": "hpu:0"}
    assert mu.check_and_set_device_map("hpu") == {"": "hpu:1"}  # LOCAL_RANK, not only for "cuda"
    assert mu.check_and_set_device_map({"": 1, "lm_head": "disk"}) == {"": "hpu:1", "lm_head": "disk"}


def test_cpu_device_map_loads(models, installed, monkeypatch):
    import transformers.modeling_utils as mu

    import accelreg.resolution

    asked = []
    resolve = accelreg.resolution.resolve
    monkeypatch.setattr(
        accelreg.resolution, "resolve", lambda spec=None, **kw: asked.append(spec) or resolve(spec, **kw)
    )
    model = _gpt2(models, device_map="cpu")
    # resolved through the registry (5.x: check_and_set_device_map; 4.57: _get_device_map)
    assert "cpu" in [str(a) for a in asked]
    seam = getattr(mu, "check_and_set_device_map", None) or mu._get_device_map
    assert _seams.original(seam) is not seam
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)


def test_auto_is_planned_by_accelreg_and_keeps_tied_weights_together(
    stock_tied_disk_offload, models, installed, monkeypatch, tmp_path
):
    _needs_disk_offload(stock_tied_disk_offload)
    calls = []
    plan = accelreg.plan_device_map

    def spy(model, max_memory=None, **kwargs):
        calls.append((dict(max_memory), kwargs))
        return plan(model, max_memory, **kwargs)

    monkeypatch.setattr(accelreg, "plan_device_map", spy)
    model = _gpt2(
        models, device_map="auto", max_memory={"cpu": "450KB", "disk": "10GB"}, offload_folder=tmp_path
    )
    assert len(calls) == 1
    budgets, kwargs = calls[0]
    assert budgets == {"cpu": 450_000, "disk": 10_000_000_000} and kwargs["strategy"] == "auto"
    device_map = model.hf_device_map
    assert set(device_map.values()) == {"cpu", "disk"}  # the budget forces an offload
    for name, _ in model.named_parameters(remove_duplicate=False):
        assert _covered(device_map, name) is not None, name
    assert _covered(device_map, "transformer.wte.weight") == _covered(device_map, "lm_head.weight")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)


def test_user_map_splitting_a_tied_pair_is_refused(models, installed, tmp_path):
    with pytest.raises(DeviceMapError) as info:
        _gpt2(models, device_map=_gpt2_map(lm_head="disk"), offload_folder=tmp_path)
    (violation,) = info.value.violations
    assert "tied group" in violation and "lm_head.weight on disk" in violation
    assert "transformer.wte.weight on cpu" in violation


def test_user_map_missing_a_module_is_refused(models, installed):
    with pytest.raises(DeviceMapError) as info:
        _gpt2(models, device_map=_gpt2_map(**{"transformer.h.1": None}))
    (violation,) = info.value.violations
    assert "covered by no key" in violation and "transformer.h.1.attn.c_attn.weight" in violation


def test_a_valid_user_map_loads(models, installed, monkeypatch):
    checked = []
    check = accelreg.check_device_map
    monkeypatch.setattr(
        accelreg, "check_device_map", lambda m, d, *a, **k: checked.append(d) or check(m, d, *a, **k)
    )
    model = _gpt2(models, device_map=_gpt2_map())
    assert checked == [_gpt2_map()]
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@needs_check_and_set
def test_expand_device_map_matches_the_longest_dotted_prefix(installed):
    import transformers.modeling_utils as mu

    params = ["model.layers.1.w", "model.layers.10.w", "model.layers.11.w", "lm_head.weight"]
    device_map = {"model.layers.1": "disk", "": "cpu"}
    assert mu.expand_device_map(device_map, params) == {
        "model.layers.1.w": "disk",
        "model.layers.10.w": "cpu",  # upstream: "disk" (an unanchored regex match)
        "model.layers.11.w": "cpu",
        "lm_head.weight": "cpu",
    }
    with pytest.raises(DeviceMapError, match=re.escape("does not cover 'lm_head.weight'")):
        mu.expand_device_map({"model.layers": "cpu"}, ["model.layers.0.w", "lm_head.weight"])
    assert mu.expand_device_map(None, ["a.b"]) == {"a.b": "cpu"}


def test_layer_1_on_disk_does_not_take_layer_10_with_it(models, installed, tmp_path):
    from transformers import LlamaForCausalLM

    device_map = {f"model.layers.{i}": "disk" if i == 1 else "cpu" for i in range(12)}
    device_map.update(
        {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    )
    model = LlamaForCausalLM.from_pretrained(models / "llama", device_map=device_map, offload_folder=tmp_path)
    layers = model.model.layers
    assert layers[1].mlp.up_proj.weight.device.type == "meta"  # offloaded to disk
    for i in (0, 10, 11):
        assert layers[i].mlp.up_proj.weight.device.type == "cpu", i
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 100)
    # a map whose keys nest is refused with a clear error. Upstream cannot load it either:
    # accelerate's dispatch_model then fails with "weight is on the meta device, we need a
    # `value` to put in on cpu" (transformers 5.24, accelerate 1.15, checked by hand)
    with pytest.raises(DeviceMapError, match=r"covered by 2 keys \('', 'model.layers.1'\)"):
        LlamaForCausalLM.from_pretrained(
            models / "llama", device_map={"": "cpu", "model.layers.1": "disk"}, offload_folder=tmp_path
        )


@pytest.mark.parametrize("bits", [8, 4])
def test_bitsandbytes_load_on_cpu_attaches_placement_hooks(models, installed, monkeypatch, bits):
    import bitsandbytes.nn.modules
    from transformers import BitsAndBytesConfig

    from accelreg import placement

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: False, raising=False)
    if bits == 8:
        config, cls = BitsAndBytesConfig(load_in_8bit=True), bitsandbytes.nn.Linear8bitLt
    else:
        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
        cls = bitsandbytes.nn.Linear4bit
    model = _gpt2(models, quantization_config=config, device_map="auto")
    quantized = {n for n, m in model.named_modules() if isinstance(m, cls)}
    attached = {n for n, m in model.named_modules() if placement.hooks._STATE in m.__dict__}
    assert len(quantized) == 8 and attached == quantized
    x = torch.tensor([[1, 2, 3]])
    logits = model(x).logits
    assert logits.shape == (1, 3, 1000) and bool(logits.isfinite().all())
    # a quantized state-dict round trip goes through the hooks (seed 000 crashed here on CPU)
    placement.load_events(model, clear=True)
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    events = placement.load_events(model)
    assert {e["module"] for e in events} == quantized
    assert {e["quant_method"] for e in events} == {f"bnb_{bits}bit"}
    assert {e["device"] for e in events} == {"cpu"}
    assert torch.allclose(model(x).logits, logits)


def test_bitsandbytes_default_device_map_comes_from_the_registry(installed):
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    quantizer = Bnb8BitHfQuantizer(BitsAndBytesConfig(load_in_8bit=True))
    assert quantizer.update_device_map(None) == {"": "cpu"}
    assert quantizer.update_device_map({"": "cpu"}) == {"": "cpu"}
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    assert quantizer.update_device_map(None) == {"": "xpu:0"}
    accelreg.reset()
    # a backend in no list of bitsandbytes' whose runtime says nothing: nothing is refused (the
    # built-in rules probe bitsandbytes' kernels only on a runtime that is up)
    accelreg.register(plugin(spec("fakeipu", 2, priority=100, device_type="ipu")), "fakeplugin_ipu")
    assert quantizer.update_device_map(None) == {"": "ipu:0"}
    accelreg.reset()
    # a placement rule that says bitsandbytes cannot place 8-bit weights there: refused, with its reason
    why = "the ipu runtime has no int8 matrix multiply"

    def rules(backend):
        if backend == "fakeipu":
            yield PlacementRule(
                backend="fakeipu",
                quant_method="bnb_8bit",
                module_classes=("Linear8bitLt",),
                param="weight",
                travelling_keys=("weight", "SCB"),
                bits_per_element=8,
                unsupported=why,
            )

    accelreg.register(
        plugin(spec("fakeipu", 2, priority=100, device_type="ipu"), rules=rules), "fakeplugin_ipu"
    )
    with pytest.raises(PlacementError, match=r"bnb_8bit weights cannot be placed on 'fakeipu': " + why):
        quantizer.update_device_map(None)


def test_device_map_for_plans_without_patching_from_a_folder_a_config_a_type_or_a_meta_model(models):
    from transformers import GPT2Config, GPT2LMHeadModel

    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    budgets = {"xpu:0": "300KB", "xpu:1": "10MB", "cpu": "1GB"}
    config = GPT2Config(**GPT2_KW)
    with torch.device("meta"):
        meta = GPT2LMHeadModel(config)
    maps = [
        accelreg.device_map_for(given, budgets)
        for given in (models / "gpt2", str(models / "gpt2"), config, meta)
    ]
    assert all(m == maps[0] for m in maps), maps
    device_map = maps[0]
    assert set(device_map.values()) == {"xpu:0", "xpu:1"}, device_map  # qualified, the registry's
    assert _covered(device_map, "transformer.wte.weight") == _covered(device_map, "lm_head.weight")
    accelreg.check_device_map(meta, device_map, budgets)
    assert not any(_integration(n).enabled for n in NAMES)  # nothing was patched
    assert set(accelreg.device_map_for("gpt2").values()) <= {"xpu:0", "xpu:1", "cpu"}  # a model type
    with pytest.raises(
        ValueError, match=r"is not a model type of transformers .*, nor a config\.json or a folder"
    ):
        accelreg.device_map_for("no-such-model-type")


def test_offload_folder_counts_as_a_disk_budget(stock_tied_disk_offload, models, installed, tmp_path):
    """transformers' own opt-in to disk offload: without a "disk" budget, offload_folder lets
    the planner use the disk (upstream's planner does the same)."""
    _needs_disk_offload(stock_tied_disk_offload)
    model = _gpt2(models, device_map="auto", max_memory={"cpu": "450KB"}, offload_folder=tmp_path)
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    assert any(tmp_path.iterdir())
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)
    with pytest.raises(DeviceMapError):  # no offload_folder: no disk, and the model does not fit
        _gpt2(models, device_map="auto", max_memory={"cpu": "450KB"})


def test_hf_device_map_keeps_the_users_own_values(models, installed, tmp_path):
    device_map = _gpt2_map(**{"transformer.h.1": "disk"})
    device_map["transformer.h.0"] = torch.device("cpu")
    model = _gpt2(models, device_map=device_map, offload_folder=tmp_path)
    assert model.hf_device_map == device_map  # upstream keeps what the user wrote
