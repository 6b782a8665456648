"""``accelreg env`` per device (issue 21, part 3): each device's name, total and free memory,
and the runtime versions the emulator's plugin reports, on two emulated npu of 1 GiB and 2 GiB.
The emulator is this checkout's (``plugins/accelreg-emu`` first on the path): the shared
environment may hold another checkout's."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest

from accelreg.testing import run_python

pytestmark = pytest.mark.emu

ROOT = Path(__file__).resolve().parents[2]
EMU_PATH = os.pathsep.join(
    [str(ROOT), str(ROOT / "plugins" / "accelreg-emu"), os.environ.get("PYTHONPATH", "")]
)

EMU_CODE = """
import json
import torch
import accelreg
from accelreg.cli.env import env_report, markdown_report
block = torch.empty(16 << 20, dtype=torch.uint8, device=accelreg.resolve("npu:1"))  # 16 MiB in use
report = env_report()
npu = next(b for b in report["backends"] if b["name"] == "npu")
print(json.dumps({"npu": npu, "report": markdown_report(report)}))
"""


@pytest.fixture(scope="module")
def emulated() -> dict:
    """``env_report`` on two emulated npu of 1 GiB and 2 GiB, 16 MiB in use on npu:1."""
    return run_python(EMU_CODE, name="npu", devices=2, memory="1GiB,2GiB", env={"PYTHONPATH": EMU_PATH}).value


def test_each_device_has_its_name(emulated):
    names = [d["name"] for d in emulated["npu"]["device_info"]]
    assert names == ["accelreg-emu NPU 0 (emulated on the host)", "accelreg-emu NPU 1 (emulated on the host)"]
    assert "| npu:1 | accelreg-emu NPU 1 (emulated on the host) |" in emulated["report"]


def test_each_device_has_its_total_memory(emulated):
    assert [d["total"] for d in emulated["npu"]["device_info"]] == [1 << 30, 2 << 30]
    assert [d["device"] for d in emulated["npu"]["device_info"]] == ["npu:0", "npu:1"]
    assert "| 1.07 GB |" in emulated["report"] and "| 2.15 GB |" in emulated["report"]


def test_each_device_has_its_free_memory(emulated):
    first, second = emulated["npu"]["device_info"]
    assert first["free"] == first["total"]
    assert 0 < second["free"] <= second["total"] - (16 << 20)


def test_the_runtime_versions_a_plugin_reports(emulated):
    versions = emulated["npu"]["versions"]
    assert versions == {"accelreg-emu": "0.2.0", "torch (extension ABI)": metadata.version("torch")}
    assert "runtime: accelreg-emu 0.2.0" in emulated["report"]
