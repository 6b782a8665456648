"""The issue-11 scenarios on an emulated two-device ``npu`` node: a mask past the devices
under a launcher, 100 devices requested and refused, ``accelreg run --devices 5``. None of them
may end on ``cpu`` silently. One subprocess runs every check (one backend name per process)."""

from __future__ import annotations

import pytest

from ._runner import check_names, run_checks

pytestmark = pytest.mark.emu

SCRIPT = r"""
import os, warnings
import accelreg
from accelreg import cli


def _env(**values):
    for key in ("ASCEND_RT_VISIBLE_DEVICES", "LOCAL_RANK"):
        os.environ.pop(key, None)
    os.environ["ACCELREG_EMU_DEVICES"] = "2"
    os.environ.update(values)
    accelreg.reset()


def check_a_mask_past_the_devices_under_a_launcher_raises():
    _env(ASCEND_RT_VISIBLE_DEVICES="5", LOCAL_RANK="0")
    try:
        accelreg.resolve()
    except accelreg.DeviceError as exc:
        assert "npu is present" in str(exc) and "LOCAL_RANK=0" in str(exc), str(exc)
    else:
        raise AssertionError("resolve() answered although npu is present and failing")


def check_100_devices_refused_warns_outside_a_launcher():
    _env(ACCELREG_EMU_DEVICES="100")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(accelreg.resolve()) == "cpu"
    messages = [str(w.message) for w in caught]
    assert any("npu is present (torch_npu is installed)" in m and "ACCELREG_EMU_DEVICES" in m for m in messages), messages


def check_run_refuses_device_5_before_launching():
    _env()
    launched = []
    os.execvpe = lambda *a: launched.append(a)  # never start anything from here
    assert cli.main(["run", "--devices", "5", "--", "true"]) == cli.EXIT_FAILED
    assert launched == []
    assert cli.main(["run", "--devices", "1", "--", "true"]) == cli.EXIT_OK and len(launched) == 1
    assert launched[0][2]["ASCEND_RT_VISIBLE_DEVICES"] == "1"
"""


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    return run_checks(SCRIPT, "npu", devices=2)


@pytest.mark.parametrize("check", check_names(SCRIPT))
def test_fallback_on_emulated_npu(results: dict[str, str], check: str) -> None:
    assert results[check] == "ok", results[check]
