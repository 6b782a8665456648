"""Impersonation smoke tests: the emulator as ``mlu``, ``musa``, ``sdaa`` and ``hpu`` (``npu``
has the full suites), one child process per name, each with three physical devices of which
the vendor's visible-devices variable exposes two ("2,0")."""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

from .._matrix import emu_names
from ._identity import module_to_keeps_parameters

pytestmark = pytest.mark.emu

MIB = 1 << 20
SAME = "Expected all tensors to be on the same device, but found at least two devices"

VISIBLE_VARS = {
    "mlu": "MLU_VISIBLE_DEVICES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
}
PACKAGES = {"mlu": "torch_mlu", "musa": "torch_musa", "sdaa": "torch_sdaa", "hpu": "habana_frameworks.torch"}


def _child(name: str) -> pytest.MarkDecorator:
    """The emulator as ``name``: physical devices 0, 1, 2 with 64, 16, 32 MiB, "2,0" visible."""
    var = VISIBLE_VARS[name]
    return pytest.mark.accelreg_emu(
        name=name, devices=3, memory="64MiB,16MiB,32MiB", **{var: "2,0", "VISIBLE_VAR": var}
    )


@dataclass(frozen=True)
class Vendor:
    """The emulated vendor of this child: its name, its package and ``torch.<name>``."""

    name: str
    package: str
    module: ModuleType

    def dev(self, i: int) -> torch.device:
        return torch.device(self.name, i)


@pytest.fixture(scope="module", params=emu_names(VISIBLE_VARS, _child))
def vendor(request: pytest.FixtureRequest) -> Vendor:
    """The vendor's package imported as a user would (it brings the emulator up, in the child)."""
    name = request.param
    assert os.environ["ACCELREG_EMU_NAME"] == name
    importlib.import_module(PACKAGES[name])
    return Vendor(name, PACKAGES[name], getattr(torch, name))


def test_shim_imports_and_only_its_own(vendor: Vendor) -> None:
    top = vendor.package.split(".")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None and os.path.join("shims", vendor.name) in spec.origin, spec
    for other in ("torch_npu", "torch_mlu", "torch_musa", "torch_sdaa", "habana_frameworks"):
        if other != top:
            assert importlib.util.find_spec(other) is None, other
    assert "+accelreg.emu" in importlib.import_module(vendor.package).__version__


def test_visible_devices_mask_and_budgets(vendor: Vendor) -> None:
    # Physical devices 0, 1, 2 with 64, 16, 32 MiB; the mask "2,0" makes them logical 0, 1.
    assert vendor.module.device_count() == 2 and vendor.module.is_available()
    assert vendor.module.mem_get_info(0) == (32 * MIB, 32 * MIB), vendor.module.mem_get_info(0)
    assert vendor.module.get_device_properties(1).total_memory == 64 * MIB


def test_tensors_on_each_device(vendor: Vendor) -> None:
    for i in range(vendor.module.device_count()):
        x = torch.arange(6.0, device=vendor.dev(i)).view(2, 3)
        assert x.device == vendor.dev(i) and (x * 2).sum().item() == 30.0
        assert torch.equal(x.to(vendor.dev(1 - i)).cpu(), torch.arange(6.0).view(2, 3))


def test_mixed_devices_and_oom_messages(vendor: Vendor) -> None:
    a, _b = torch.ones(2, device=vendor.dev(0)), torch.ones(2, device=vendor.dev(1))
    try:
        torch.index_select(a, 0, torch.tensor([0], device=vendor.dev(1)))
    except RuntimeError as e:
        assert SAME in str(e) and f"{vendor.name}:0 and {vendor.name}:1!" in str(e), str(e)
    else:
        raise AssertionError("mixed devices accepted")
    try:
        torch.empty(33 * MIB, dtype=torch.uint8, device=vendor.dev(0))
    except torch.OutOfMemoryError as e:
        msg = str(e)
        assert f"{vendor.name.upper()} out of memory" in msg, msg
        assert f"{vendor.name}:0 has a total capacity of 32.00 MiB" in msg, msg
    else:
        raise AssertionError("no OOM past the budget")


def test_tiny_model_forward_backward_on_device_1(vendor: Vendor) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    ref = model(x).pow(2).mean()
    ref.backward()
    ref_grad = model[0].weight.grad.clone()
    model.zero_grad()
    model.to(vendor.dev(1))
    loss = model(x.to(vendor.dev(1))).pow(2).mean()
    loss.backward()
    assert torch.allclose(loss.cpu(), ref.detach(), atol=1e-6)
    grad = model[0].weight.grad
    assert grad.device == vendor.dev(1) and torch.allclose(grad.cpu(), ref_grad, atol=1e-6)


def test_module_to_keeps_its_parameters(vendor: Vendor) -> None:
    module_to_keeps_parameters(vendor.dev(1))  # hpu is in-tree: torch's own rule already holds


def test_accelerate_detects_it(vendor: Vendor) -> None:
    import accelerate.utils as au
    from accelerate import PartialState

    assert getattr(au, f"is_{vendor.name}_available")(), vendor.name
    assert PartialState().device.type == vendor.name


def test_transformers_detects_it(vendor: Vendor) -> None:
    import transformers.utils as tu

    probe = getattr(tu, f"is_torch_{vendor.name}_available", None)
    if vendor.name == "sdaa":
        assert probe is None, "transformers gained is_torch_sdaa_available: add it to this check"
        return
    assert probe(), vendor.name


def test_deepspeed_accelerator(vendor: Vendor) -> None:
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if vendor.name == "musa":
        # DeepSpeed 0.19.8 has no MUSA accelerator and falls back to CPU (an upstream gap).
        assert acc.device_name() == "cpu", "DeepSpeed now knows musa: check its accelerator here"
        return
    assert acc.device_name() == vendor.name and acc.device_count() == 2, acc.device_name()
    assert acc.total_memory(0) == 32 * MIB
    stream, event = acc.Stream(), acc.Event(enable_timing=True)
    event.record(stream)
    assert event.query()


def test_peft_infer_device_ladder(vendor: Vendor) -> None:
    # peft's ladder knows cuda, mps, mlu, xpu and npu only; from 0.22 it asks torch.accelerator
    # after them, which names any vendor whose runtime registers with torch (as the emulator does).
    import peft
    from packaging.version import Version
    from peft.utils.other import infer_device

    asks_torch = Version(peft.__version__) >= Version("0.22")
    expected = vendor.name if vendor.name in ("mlu",) or asks_torch else "cpu"
    assert infer_device() == expected, (infer_device(), expected)


def test_accelreg_plugin_spec(vendor: Vendor) -> None:
    from accelreg_emu.plugin import accelreg_backends

    (spec,) = list(accelreg_backends())
    assert spec.name == vendor.name and spec.visible_devices_var == os.environ["VISIBLE_VAR"]
    assert spec.priority == {"mlu": 70, "musa": 60, "sdaa": 50, "hpu": 40}[vendor.name]
    assert spec.is_available().available and spec.device_count() == 2
    assert spec.memory_info(0).total == 32 * MIB
    assert spec.indexed is (vendor.name != "hpu")
