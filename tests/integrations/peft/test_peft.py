"""peft through accelreg's integration, against the real library: an unparsable version is only an
untested one; a changed private function is skipped (its fingerprint); ``infer_device`` is the
registry's device."""

from __future__ import annotations

import pytest

import accelreg
import accelreg.integrations as integrations
from accelreg.integrations._machinery import seams as _seams

from ..._fakes import plugin, spec
from .._support import _fake_version, _integration, _module


def test_an_unparsable_version_is_only_an_untested_one(monkeypatch):
    _fake_version(monkeypatch, "peft", "not-a-version")
    _module("peft").enable()
    note = _integration("peft").status()["note"]
    assert note.startswith("peft not-a-version: outside the releases it serves (>=0.17,<0.23)"), note


def test_a_changed_private_function_is_skipped(monkeypatch):
    import peft.utils.other

    def infer_device():  # same name and signature, different code
        return "cuda"

    monkeypatch.setattr(peft.utils.other, "infer_device", infer_device)
    with pytest.warns(
        integrations.IntegrationWarning, match=r"peft\.utils\.other\.infer_device skipped .*has shape"
    ):
        _module("peft").enable()
    assert peft.utils.other.infer_device is infer_device


def test_peft_infer_device_is_the_registry_device(installed, monkeypatch):
    import peft.peft_model
    import peft.utils
    import peft.utils.other
    import peft.utils.save_and_load

    holders = (peft.utils.other, peft.utils, peft.utils.save_and_load, peft.peft_model)
    assert {h.infer_device() for h in holders} == {"cpu"}
    assert all(_seams.original(h.infer_device) is not h.infer_device for h in holders)
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    # peft's own form, a device type (callers compare it with tensor.device.type); upstream
    # answers cuda first and knows no musa/sdaa/hpu. The indexed device is accelreg.resolve().
    assert {h.infer_device() for h in holders} == {"xpu"}
    assert str(accelreg.resolve()) == "xpu:1"
