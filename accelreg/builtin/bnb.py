"""Built-in placement rules for bitsandbytes' quantized layers, on every backend.

Sizes follow bitsandbytes 0.50: 8-bit weights are int8 plus one float32 scale (``SCB``) per
output row; 4-bit weights are two values per byte plus one float32 ``absmax`` per block of 64
elements and a 16-entry float32 quantization map. A quantized weight can only be used where
bitsandbytes runs it: on an accelerator it may not be offloaded to cpu or disk (an offloaded
layer must stay unquantized, as transformers' ``llm_int8_enable_fp32_cpu_offload`` does); on
the cpu backend the cpu *is* its device.
"""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..types import PlacementRule
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


@hookimpl
def accelreg_placement_rules(backend: str):
    offload = frozenset({"cpu"}) if backend == "cpu" else frozenset()
    yield PlacementRule(
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
