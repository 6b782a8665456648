"""Built-in placement rules for bitsandbytes' quantized layers, on every backend.

Sizes follow bitsandbytes 0.50: 8-bit weights are int8 plus one float32 scale (``SCB``) per
output row; 4-bit weights are two values per byte plus one float32 ``absmax`` per block of 64
elements and a 16-entry float32 quantization map. A quantized weight can only be used where
bitsandbytes runs it: on an accelerator it may not be offloaded to cpu or disk (an offloaded
layer must stay unquantized, as transformers' ``llm_int8_enable_fp32_cpu_offload`` does); on
the cpu backend the cpu *is* its device. Where bitsandbytes cannot quantize 8-bit weights onto a
backend's devices (:func:`eight_bit_unsupported`), or its kernels do not run a method there
(:func:`kernels_unsupported`, a behaviour probe of bitsandbytes itself, never its list of
device names), the rule for that backend says so and :func:`accelreg.placement_rule` refuses
to place them there, up front; layers that already live there still load through the rule's
adapters.
"""

from __future__ import annotations

import dataclasses
import sys

from ..plugin import PlacementRule, hookimpl
from . import bnb_load

PROVIDER = "accelreg"

EIGHT_BIT_CLASSES = ("bitsandbytes.nn.modules.Linear8bitLt",)
FOUR_BIT_CLASSES = (
    "bitsandbytes.nn.modules.Linear4bit",
    "bitsandbytes.nn.modules.LinearNF4",
    "bitsandbytes.nn.modules.LinearFP4",
)
#: State-dict key suffixes of a 4-bit weight's quantization state (``weight.`` + component).
FOUR_BIT_STATE = (
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
    "weight.quant_state.",
)


def eight_bit_unsupported(backend: str) -> str:
    """Why bitsandbytes cannot quantize 8-bit weights onto ``backend``'s devices; ``""`` when it
    can or nothing is known.

    bitsandbytes 0.47-0.50 quantizes an 8-bit weight on its way from the cpu and then swaps the
    parameter's data for the int8 result (``Int8Params._quantize``: ``self.data = CB``). torch
    allows that swap only between tensor types it deems shallow-copy compatible: the in-tree
    accelerators are, and a PrivateUse1 device is only when its runtime registers an override
    of ``_has_compatible_shallow_copy_type`` (vendor runtimes do). The probe asks torch that
    question with two empty tensors; it only runs for the backend that is torch's PrivateUse1
    device type and is up in this process.
    """
    torch = sys.modules.get("torch")
    if torch is None or backend != torch._C._get_privateuse1_backend_name():
        return ""
    try:
        compatible = torch._has_compatible_shallow_copy_type(torch.empty(0), torch.empty(0, device=backend))
    except Exception:  # noqa: BLE001 - runtime not up here: nothing is known, nothing refused
        return ""
    if compatible:
        return ""
    return (
        f"bitsandbytes cannot quantize 8-bit weights onto {backend}: it quantizes a weight on its way from the "
        f"cpu and swaps the parameter's data for the int8 result, which torch refuses between cpu and "
        f"{backend} tensors ({backend} is a PrivateUse1 device whose runtime registers no "
        "_has_compatible_shallow_copy_type override); load in 4-bit (BitsAndBytesConfig(load_in_4bit=True)) "
        "or quantize 8-bit on the cpu backend"
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def kernels_unsupported(backend: str, quant_method: str) -> str:
    """Why bitsandbytes' kernels do not run ``quant_method`` (``"bnb_8bit"``, ``"bnb_4bit"``) on
    ``backend``'s devices; ``""`` when they do or nothing is known.

    A behaviour probe, not bitsandbytes' list of device names (``supported_torch_devices``):
    bitsandbytes dispatches its operators through torch, and its default kernels, written in
    torch operators, run on any device whose runtime computes them. The probe runs what a
    quantized load and its forward run, on tensors of a few hundred bytes on the runtime's current
    device (a launched rank's own: no other device is touched): 8-bit,
    the row-wise quantization and the int8 matrix multiply; 4-bit, quantizing and dequantizing
    a block. It runs only when bitsandbytes is already imported and the backend is torch's
    device type of that name with its runtime up (nothing is known otherwise, and nothing is
    refused); never for the cpu backend, where the cpu is the device.
    """
    torch = sys.modules.get("torch")
    functional = sys.modules.get("bitsandbytes.functional")
    if torch is None or functional is None or backend == "cpu":
        return ""
    runtime = getattr(torch, backend, None)
    try:
        if runtime is None or not runtime.is_available():
            return ""
        current = getattr(runtime, "current_device", None)  # this process's device: no other is touched
        device = torch.device(backend, current() if callable(current) else 0)
    except Exception:  # noqa: BLE001 - not a device type of torch's here: nothing is known
        return ""
    try:
        if quant_method == "bnb_8bit":
            rows, _scales, _outliers = functional.int8_vectorwise_quant(
                torch.ones(2, 64, dtype=torch.float16, device=device)
            )
            functional.int8_linear_matmul(rows, rows)
        else:
            packed, state = functional.quantize_4bit(torch.ones(64, 2, dtype=torch.float16, device=device))
            functional.dequantize_4bit(packed, state)
    except Exception as exc:  # noqa: BLE001 - the answer is that bitsandbytes does not run there
        version = getattr(sys.modules.get("bitsandbytes"), "__version__", "")
        bits = "8-bit" if quant_method == "bnb_8bit" else "4-bit"
        return f"bitsandbytes {version} cannot run its {bits} kernels on {backend} ({_first_line(exc)})"
    return ""


@hookimpl
def accelreg_placement_rules(backend: str):
    offload = frozenset({"cpu"}) if backend == "cpu" else frozenset()
    eight = PlacementRule(
        backend="*",
        quant_method="bnb_8bit",
        module_classes=EIGHT_BIT_CLASSES,
        param="weight",
        travelling_keys=("weight", "SCB", "weight_format"),
        dropped_keys=(),
        offload=offload,
        bits_per_element=8,
        bytes_per_row=4,
        provider=PROVIDER,
        before_load=bnb_load.before_load_8bit,
        after_load=bnb_load.after_load_8bit,
    )
    yield eight
    reason = eight_bit_unsupported(backend) or kernels_unsupported(backend, "bnb_8bit")
    if reason:  # exact beats "*"; the load adapters stay (a layer already there loads fine)
        yield dataclasses.replace(eight, backend=backend, unsupported=reason)
    four = PlacementRule(
        backend="*",
        quant_method="bnb_4bit",
        module_classes=FOUR_BIT_CLASSES,
        param="weight",
        travelling_keys=("weight", *FOUR_BIT_STATE),
        offload=offload,
        bits_per_element=4,
        block_size=64,
        bytes_per_block=4,
        fixed_bytes=16 * 4,
        provider=PROVIDER,
        before_load=bnb_load.before_load_4bit,
    )
    yield four
    reason = kernels_unsupported(backend, "bnb_4bit")
    if reason:
        yield dataclasses.replace(four, backend=backend, unsupported=reason)
