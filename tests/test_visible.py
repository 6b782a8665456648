"""Visible-device variables: each backend's variable, parsed the way its runtime reads it."""

from __future__ import annotations

import pytest

import accelreg
from accelreg import ConfigError
from accelreg.registry.visible import mask_value, parse_visible_devices, parse_visible_devices_truncating

VARS = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
    "mlu": "MLU_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
}


def parse_cuda(value: str) -> tuple[str, ...]:
    return parse_visible_devices_truncating(value, var="CUDA_VISIBLE_DEVICES")


def test_every_builtin_declares_its_variable():
    declared = {b.name: b.visible_devices_var for b in accelreg.backends()}
    for name, var in VARS.items():
        assert declared[name] == var


@pytest.mark.parametrize("name", sorted(VARS))
@pytest.mark.parametrize(
    ("value", "ids"),
    [("0,1", ("0", "1")), ("3, 1", ("3", "1")), ("", ()), ("NoDevFiles", ()), ("2", ("2",))],
)
def test_each_backend_parses_its_variable(name, value, ids, monkeypatch):
    monkeypatch.setenv(VARS[name], value)
    accelreg.reset()
    info = {b.name: b for b in accelreg.backends()}[name]
    assert info.visible_devices == ids


@pytest.mark.parametrize("name", sorted(VARS))
def test_unset_means_all_visible(name):
    assert {b.name: b for b in accelreg.backends()}[name].visible_devices is None


@pytest.mark.parametrize("name", sorted(set(VARS) - {"cuda"}))
def test_invalid_entries_are_reported_not_guessed(name, monkeypatch):
    monkeypatch.setenv(VARS[name], "0,abc")
    accelreg.reset()
    from accelreg.cli import env_report

    with pytest.warns(RuntimeWarning, match=f"{name} is present"):  # a mask names its devices
        row = {b["name"]: b for b in env_report()["backends"]}[name]
    assert row["visible_devices"] is None and "'abc' is not a device id" in row["visible_devices_error"]


def test_cuda_truncates_at_the_first_invalid_entry_like_the_runtime():
    assert parse_cuda("0,2,-1,1") == ("0", "2")
    assert parse_cuda("-1") == ()
    assert parse_cuda("1,1,0") == ("1",)
    assert parse_cuda("GPU-8f3a,MIG-12ab/1/2") == ("GPU-8f3a", "MIG-12ab/1/2")
    assert parse_cuda(" 0 , 1 ") == ("0", "1")


def test_subdevices_and_ranges_only_where_the_runtime_allows_them():
    assert parse_visible_devices("0.1,1", subdevices=True) == ("0.1", "1")
    with pytest.raises(ConfigError, match="not a device id"):
        parse_visible_devices("0.1")
    assert parse_visible_devices("0-2,5", ranges=True) == ("0", "1", "2", "5")
    with pytest.raises(ConfigError, match="not a device id"):
        parse_visible_devices("0-2")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_visible_devices("0,1,0")
    with pytest.raises(ConfigError, match="not a device id"):
        parse_visible_devices("-1")
    with pytest.raises(TypeError):
        parse_visible_devices(3)


def test_mask_value_round_trips():
    assert mask_value([2, 0]) == "2,0"
    assert parse_visible_devices(mask_value([3, 1])) == ("3", "1")
    for bad in ([-1], [0, 0], [True], ["a,b"]):
        with pytest.raises((ConfigError, TypeError)):
            mask_value(bad)


def test_an_empty_value_means_no_device_and_never_reaches_a_plugin_parser(monkeypatch):
    from accelreg.types import Availability, BackendSpec

    seen: list[str] = []

    def parser(value: str) -> tuple[str, ...]:
        seen.append(value)
        if not value:
            raise RuntimeError("this parser cannot handle an empty value")
        return tuple(value.split(","))

    @accelreg.hookimpl
    def accelreg_backends():
        yield BackendSpec(
            name="acme",
            priority=10,
            device_type="ve",
            is_available=lambda: Availability.no("scripted"),
            device_count=lambda: 0,
            visible_devices_var="ACME_VISIBLE",
            parse_visible_devices=parser,
        )

    import types

    for value in ("", "  "):
        monkeypatch.setenv("ACME_VISIBLE", value)
        accelreg.reset()
        accelreg.register(types.SimpleNamespace(accelreg_backends=accelreg_backends), "fakeplugin_parser")
        assert {b.name: b for b in accelreg.backends()}["acme"].visible_devices == ()
    assert seen == [] and not accelreg.failures()
