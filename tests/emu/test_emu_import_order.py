"""The emulated runtime works under any import order, as the vendor runtimes do (issue 42).

transformers asks ``torch.accelerator`` when it is imported, before anything of the emulator
is. Under ``hpu`` (torch's in-tree device type, whose accelerator hooks torch reads once per
process) that used to settle torch on "no accelerator" before the emulator's runtime came up,
and its warm-up backward then failed with "Cannot access accelerator device when none is
available". The emulator now comes up with torch, as torch's autoload brings up Gaudi's runtime.
Each case is a fresh process: the order is the point.
"""

from __future__ import annotations

import pytest

from accelreg.testing import run_python

from .._matrix import emu_names

pytestmark = pytest.mark.emu

#: hpu first: it is the name that failed, and the one the default run covers.
NAMES = ("hpu", "npu", "mlu", "musa", "sdaa", "emu")

INSTALL_THEN_TRANSFORMERS = """
import json
import accelreg
accelreg.install()
import transformers.training_args  # asks torch.accelerator at import
import torch
device = accelreg.resolve(0)
x = torch.ones(3, device=device, requires_grad=True)
(x * 2).sum().backward()
accelerator = torch.accelerator.current_accelerator()
print(json.dumps({
    "device": str(device),
    "grad": x.grad.tolist(),
    "grad_device": str(x.grad.device),
    "accelerator": None if accelerator is None else accelerator.type,
}))
"""


@pytest.mark.parametrize("name", emu_names(NAMES))
def test_install_then_transformers_import(name: str) -> None:
    value = run_python(INSTALL_THEN_TRANSFORMERS, name=name, devices=2).value
    device = "hpu" if name == "hpu" else f"{name}:0"
    assert value == {
        "device": device,
        "grad": [2.0, 2.0, 2.0],
        "grad_device": "hpu:0" if name == "hpu" else device,
        "accelerator": name,
    }, value


def test_hpu_runtime_comes_up_with_torch() -> None:
    """Right after ``import torch`` torch's accelerator is hpu and backward runs on it, as with
    Gaudi's runtime (torch autoloads ``habana_frameworks.torch``)."""
    code = """
import json, sys
import torch
first = torch.accelerator.current_accelerator()
x = torch.ones(2, device="hpu:1", requires_grad=True)
(x * 3).sum().backward()
print(json.dumps({
    "first": None if first is None else first.type,
    "vendor_loaded": "habana_frameworks.torch" in sys.modules,
    "grad": [str(x.grad.device), x.grad.tolist()],
}))
"""
    value = run_python(code, name="hpu", devices=2).value
    assert value == {"first": "hpu", "vendor_loaded": True, "grad": ["hpu:1", [3.0, 3.0]]}, value


def test_hpu_without_autoload_fails_in_words() -> None:
    """With torch's autoload switched off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) and torch's
    accelerator asked first, torch has settled on "no accelerator" for the process: bringing
    the runtime up then is refused with what to do, not with torch's bare error from inside the
    autograd engine."""
    code = """
import json, sys
import torch
first = torch.accelerator.current_accelerator()
try:
    import habana_frameworks.torch
except RuntimeError as exc:
    error = str(exc)
else:
    error = None
print(json.dumps({"first": None if first is None else first.type, "error": error}))
"""
    value = run_python(code, name="hpu", devices=2, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}).value
    assert value["first"] is None, value
    assert value["error"] is not None and "settled on 'no accelerator'" in value["error"], value
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" in value["error"], value


CPU_BACKWARD_FIRST = """
import json, warnings
import torch
x = torch.ones(2, requires_grad=True)
(x * 2).sum().backward()  # the engine sizes its device queues now: no emu device registered yet
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import accelreg
    device = accelreg.resolve("emu:1")  # brings the runtime up
t = torch.ones(2, device=device) + 1
y = torch.ones(2, device="emu:0", requires_grad=True)
try:
    (y * 2).sum().backward()
    backward = "ran"
except RuntimeError as exc:
    backward = "device_ready_queues_" in str(exc)
print(json.dumps({
    "device": str(device),
    "sum": t.cpu().tolist(),
    "warned": [str(w.message) for w in caught if "accelreg-emu" in str(w.message)],
    "backward_fails_in_torch": backward,
}))
"""


def test_a_runtime_up_after_a_cpu_backward_comes_up_and_says_why_its_backward_fails() -> None:
    """A process that ran a backward pass on the cpu before anything brought the emulated
    runtime up (``accelerate launch --cpu`` under ``accelreg run``: accelreg asks the registry
    only when DeepSpeed is imported, after training): torch sized its autograd queues without
    the device. The runtime still comes up (the registry's probe does not fail: a rank on the
    cpu goes on), with one warning naming why a backward pass on its devices fails, as with a
    vendor runtime imported late."""
    value = run_python(CPU_BACKWARD_FIRST, name="emu", devices=2).value
    assert value["device"] == "emu:1" and value["sum"] == [2.0, 2.0], value
    assert value["backward_fails_in_torch"] is True, value
    (message,) = value["warned"]
    assert "a backward pass ran in this process before the emulated emu runtime came up" in message
