"""Impersonation smoke tests: the emulator as ``mlu``, ``musa``, ``sdaa`` and ``hpu`` (``npu``
has the full suites), one subprocess per name, each with three physical devices of which
the vendor's visible-devices variable exposes two ("2,0")."""

from __future__ import annotations

import pytest

from ._runner import check_names, run_checks

pytestmark = pytest.mark.emu

MIB = 1 << 20

VISIBLE_VARS = {
    "mlu": "MLU_VISIBLE_DEVICES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
}

SCRIPT = r"""
import importlib, importlib.util, os
import torch

NAME = os.environ["ACCELREG_EMU_NAME"]
PACKAGE = {"mlu": "torch_mlu", "musa": "torch_musa", "sdaa": "torch_sdaa", "hpu": "habana_frameworks.torch"}[NAME]
MIB = 1 << 20
SAME = "Expected all tensors to be on the same device, but found at least two devices"
importlib.import_module(PACKAGE)
MOD = getattr(torch, NAME)


def dev(i):
    return torch.device(NAME, i)


def check_shim_imports_and_only_its_own():
    top = PACKAGE.split(".")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None and os.path.join("shims", NAME) in spec.origin, spec
    for other in ("torch_npu", "torch_mlu", "torch_musa", "torch_sdaa", "habana_frameworks"):
        if other != top:
            assert importlib.util.find_spec(other) is None, other
    assert "+accelreg.emu" in importlib.import_module(PACKAGE).__version__


def check_visible_devices_mask_and_budgets():
    # Physical devices 0, 1, 2 with 64, 16, 32 MiB; the mask "2,0" makes them logical 0, 1.
    assert MOD.device_count() == 2 and MOD.is_available()
    assert MOD.mem_get_info(0) == (32 * MIB, 32 * MIB), MOD.mem_get_info(0)
    assert MOD.get_device_properties(1).total_memory == 64 * MIB


def check_tensors_on_each_device():
    for i in range(MOD.device_count()):
        x = torch.arange(6.0, device=dev(i)).view(2, 3)
        assert x.device == dev(i) and (x * 2).sum().item() == 30.0
        assert torch.equal(x.to(dev(1 - i)).cpu(), torch.arange(6.0).view(2, 3))


def check_mixed_devices_and_oom_messages():
    a, b = torch.ones(2, device=dev(0)), torch.ones(2, device=dev(1))
    try:
        torch.index_select(a, 0, torch.tensor([0], device=dev(1)))
    except RuntimeError as e:
        assert SAME in str(e) and f"{NAME}:0 and {NAME}:1!" in str(e), str(e)
    else:
        raise AssertionError("mixed devices accepted")
    try:
        torch.empty(33 * MIB, dtype=torch.uint8, device=dev(0))
    except torch.OutOfMemoryError as e:
        assert f"{NAME.upper()} out of memory" in str(e) and f"{NAME}:0 has a total capacity of 32.00 MiB" in str(e), str(e)
    else:
        raise AssertionError("no OOM past the budget")


def check_tiny_model_forward_backward_on_device_1():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    ref = model(x).pow(2).mean()
    ref.backward()
    ref_grad = model[0].weight.grad.clone()
    model.zero_grad()
    model.to(dev(1))
    loss = model(x.to(dev(1))).pow(2).mean()
    loss.backward()
    assert torch.allclose(loss.cpu(), ref.detach(), atol=1e-6)
    assert model[0].weight.grad.device == dev(1) and torch.allclose(model[0].weight.grad.cpu(), ref_grad, atol=1e-6)


def check_accelerate_detects_it():
    import accelerate.utils as au
    from accelerate import PartialState

    assert getattr(au, f"is_{NAME}_available")(), NAME
    assert PartialState().device.type == NAME


def check_transformers_detects_it():
    import transformers.utils as tu

    probe = getattr(tu, f"is_torch_{NAME}_available", None)
    if NAME == "sdaa":
        assert probe is None, "transformers gained is_torch_sdaa_available: add it to this check"
        return
    assert probe(), NAME


def check_deepspeed_accelerator():
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if NAME == "musa":
        # DeepSpeed 0.19.8 has no MUSA accelerator and falls back to CPU (an upstream gap).
        assert acc.device_name() == "cpu", "DeepSpeed now knows musa: check its accelerator here"
        return
    assert acc.device_name() == NAME and acc.device_count() == 2, acc.device_name()
    assert acc.total_memory(0) == 32 * MIB
    stream, event = acc.Stream(), acc.Event(enable_timing=True)
    event.record(stream)
    assert event.query()


def check_peft_infer_device_ladder():
    from peft.utils.other import infer_device

    # peft 0.21.2's ladder knows cuda, mps, mlu, xpu and npu only.
    expected = NAME if NAME in ("mlu",) else "cpu"
    assert infer_device() == expected, (infer_device(), expected)


def check_accelreg_plugin_spec():
    from accelreg_emu.plugin import accelreg_backends

    (spec,) = list(accelreg_backends())
    assert spec.name == NAME and spec.visible_devices_var == os.environ["VISIBLE_VAR"]
    assert spec.priority == {"mlu": 70, "musa": 60, "sdaa": 50, "hpu": 40}[NAME]
    assert spec.is_available().available and spec.device_count() == 2
    assert spec.memory_info(0).total == 32 * MIB
    assert spec.indexed is (NAME != "hpu")
"""


@pytest.fixture(scope="module", params=sorted(VISIBLE_VARS))
def vendor(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    name = request.param
    var = VISIBLE_VARS[name]
    results = run_checks(
        SCRIPT, name, devices=3, memory="64MiB,16MiB,32MiB", extra_env={var: "2,0", "VISIBLE_VAR": var}
    )
    return name, results


@pytest.mark.parametrize("check", check_names(SCRIPT))
def test_vendor(vendor: tuple[str, dict[str, str]], check: str) -> None:
    name, results = vendor
    assert results[check] == "ok", f"[{name}] {results[check]}"
