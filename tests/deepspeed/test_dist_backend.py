"""``accelreg.dist_backend()``: the collective backend each plugin declares (no ``"nccl"`` ladder)."""

from __future__ import annotations

import types

import pytest

import accelreg
from accelreg.types import BackendSpec

BUILTIN = {
    "cpu": "gloo",
    "cuda": "nccl",
    "xpu": "xccl",
    "npu": "hccl",
    "mlu": "cncl",
    "musa": "mccl",
    "sdaa": "tccl",
    "hpu": "hccl",
    "mps": "gloo",
}


def test_each_builtin_declares_its_collective_backend() -> None:
    assert {b.name: accelreg.dist_backend(b.name) for b in accelreg.backends() if b.builtin} == BUILTIN


def test_default_is_the_current_backends() -> None:
    assert accelreg.current_backend().name == "cpu"
    assert accelreg.dist_backend() == "gloo"


def test_bad_names() -> None:
    with pytest.raises(accelreg.DeviceError, match="unknown backend 'nope'"):
        accelreg.dist_backend("nope")
    with pytest.raises(TypeError, match="backend must be a backend name"):
        accelreg.dist_backend(0)  # type: ignore[arg-type]


def test_a_plugin_that_declares_none_is_an_error_not_a_guess() -> None:
    plugin = types.SimpleNamespace(
        accelreg_backends=accelreg.hookimpl(
            lambda: [BackendSpec(name="acme", priority=99, is_available=lambda: True, device_count=lambda: 1)]
        )
    )
    accelreg.register(plugin, "fakeplugin_acme")
    with pytest.raises(accelreg.DeviceError, match="acme declares no collective backend"):
        accelreg.dist_backend("acme")


@pytest.mark.parametrize(
    ("name", "collective"), [("emu", "emuccl"), ("npu", "hccl"), ("musa", "mccl"), ("hpu", "hccl")]
)
def test_the_emulator_declares_the_emulated_runtimes_collective_backend(
    monkeypatch: pytest.MonkeyPatch, name: str, collective: str
) -> None:
    from accelreg_emu import plugin

    monkeypatch.setenv("ACCELREG_EMU_NAME", name)
    (spec,) = plugin.accelreg_backends()  # declaring activates nothing
    assert spec.name == name and spec.dist_backend == collective
