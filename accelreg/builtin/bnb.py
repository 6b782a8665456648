"""Built-in placement rules for bitsandbytes' quantized layers, on every backend.

Sizes follow bitsandbytes 0.50: 8-bit weights are int8 plus one float32 scale (``SCB``) per
output row; 4-bit weights are two values per byte plus one float32 ``absmax`` per block of 64
elements and a 16-entry float32 quantization map. A quantized weight can only be used where
bitsandbytes runs it: on an accelerator it may not be offloaded to cpu or disk (an offloaded
layer must stay unquantized, as transformers' ``llm_int8_enable_fp32_cpu_offload`` does); on
the cpu backend the cpu *is* its device. Where bitsandbytes cannot quantize 8-bit weights onto a
backend's devices (:func:`eight_bit_unsupported`), the 8-bit rule for that backend says so and
:func:`accelreg.placement_rule` refuses to place them there, up front; layers that already live
there still load through the rule's adapters.
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
    reason = eight_bit_unsupported(backend)
    if reason:  # exact beats "*"; the load adapters stay (a layer already there loads fine)
        yield dataclasses.replace(eight, backend=backend, unsupported=reason)
    yield PlacementRule(
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
