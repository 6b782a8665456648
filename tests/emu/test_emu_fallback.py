"""The issue-11 scenarios on an emulated two-device ``npu`` node: a mask past the devices
under a launcher, 100 devices requested and refused, ``accelreg run --devices 5``. None of them
may end on ``cpu`` silently. One child process runs them all (one backend name per process)."""

from __future__ import annotations

import os
import warnings

import pytest

import accelreg
from accelreg import cli

pytestmark = [pytest.mark.emu, pytest.mark.accelreg_emu(name="npu", devices=2)]


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for key in ("ASCEND_RT_VISIBLE_DEVICES", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ACCELREG_EMU_DEVICES", "2")
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    accelreg.reset()


def test_a_mask_past_the_devices_under_a_launcher_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, ASCEND_RT_VISIBLE_DEVICES="5", LOCAL_RANK="0")
    with pytest.raises(accelreg.DeviceError) as info:
        accelreg.resolve()
    assert "npu is present" in str(info.value) and "LOCAL_RANK=0" in str(info.value), str(info.value)


def test_100_devices_refused_warns_outside_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, ACCELREG_EMU_DEVICES="100")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(accelreg.resolve()) == "cpu"
    messages = [str(w.message) for w in caught]
    assert any(
        "npu is present (torch_npu is installed)" in m and "ACCELREG_EMU_DEVICES" in m for m in messages
    ), messages


def test_run_refuses_device_5_before_launching(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch)
    launched: list[tuple[object, ...]] = []
    monkeypatch.setattr(os, "execvpe", lambda *a: launched.append(a))  # never start anything from here
    assert cli.main(["run", "--devices", "5", "--", "true"]) == cli.EXIT_FAILED
    assert launched == []
    assert cli.main(["run", "--devices", "1", "--", "true"]) == cli.EXIT_OK and len(launched) == 1
    assert launched[0][2]["ASCEND_RT_VISIBLE_DEVICES"] == "1"
