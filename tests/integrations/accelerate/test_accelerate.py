"""accelerate through accelreg's integration, against the real library: a changed signature and
a vanished seam are skipped alone; ``get_max_memory`` and ``PartialState.default_device`` follow
the registry."""

from __future__ import annotations

import inspect

import pytest
import torch

import accelreg
import accelreg.integrations as integrations
from accelreg import DeviceError

from ..._fakes import plugin, spec
from .._support import _integration, _module


def test_a_changed_signature_is_skipped(monkeypatch):
    import accelerate.utils.memory

    def clear_device_cache():
        pass

    monkeypatch.setattr(accelerate.utils.memory, "clear_device_cache", clear_device_cache)
    with pytest.warns(integrations.IntegrationWarning, match=r"lacks parameters \['garbage_collection'\]"):
        _module("accelerate").enable()
    assert accelerate.utils.memory.clear_device_cache is clear_device_cache
    assert _integration("accelerate").enabled


def test_a_seam_that_vanished_is_skipped(monkeypatch, recwarn):
    import accelerate.big_modeling

    monkeypatch.delattr(accelerate.big_modeling, "dispatch_model")
    _module("accelerate").enable()
    assert _integration("accelerate").status()["skipped"] == ["accelerate.big_modeling.dispatch_model"]
    (w,) = [w for w in recwarn if issubclass(w.category, integrations.IntegrationWarning)]
    assert "does not exist" in str(w.message)


def test_accelerate_memory_and_default_device_follow_the_registry(installed, monkeypatch):
    import accelerate.utils
    from accelerate.state import PartialState

    assert set(accelerate.utils.get_max_memory()) == {"cpu"}
    # a given max_memory keeps accelerate's contract: int keys as they are (planning for
    # another machine), sorted ints first, values parsed
    assert accelerate.utils.get_max_memory({"cpu": "1GB", 0: "1GB", 2: "2GB"}) == {
        0: 1_000_000_000,
        2: 2_000_000_000,
        "cpu": 1_000_000_000,
    }
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    memory = accelerate.utils.get_max_memory()
    assert list(memory) == [0, 1, "cpu"] and memory[0] == 1 << 30 and memory[1] == 2 << 30
    assert accelerate.utils.get_max_memory({"xpu:1": "1GB", 0: "2GB", "cpu": "1GB"}) == {
        0: 2_000_000_000,
        1: 1_000_000_000,
        "cpu": 1_000_000_000,
    }
    with pytest.raises(
        DeviceError, match="is a cuda device, but accelerate plans for the current backend xpu"
    ):
        accelerate.utils.get_max_memory({"cuda:0": "1GB"})
    # accelerate's form: the backend the registry chose, no index (the runtime's current one)
    assert inspect.getattr_static(PartialState, "default_device").fget(None) == torch.device("xpu")


def test_a_bitsandbytes_parameter_moving_to_an_accelerator_asks_the_placement_rules(installed):
    """Quantize-on-move decides with the placement rules of the device's backend (it raised
    AttributeError for every bitsandbytes parameter moving to an accelerator before 0.2.0: the
    backend lookup named a function placement does not export)."""
    import bitsandbytes as bnb

    from accelreg.integrations.accelerate.modeling import _quantize_on_move

    layer = bnb.nn.Linear8bitLt(4, 4, has_fp16_weights=False)
    assert type(layer.weight).__name__ == "Int8Params" and layer.weight.device.type == "cpu"
    rule = accelreg.placement_rule("xpu", "bnb_8bit")
    assert _quantize_on_move(layer, layer.weight, "xpu:0") is rule.may_live_on("xpu:0") is True
    assert _quantize_on_move(layer, layer.weight, "cpu") is False  # not an accelerator
    assert _quantize_on_move(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).weight, "xpu:0") is False
