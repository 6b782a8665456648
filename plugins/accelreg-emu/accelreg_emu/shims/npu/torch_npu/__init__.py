"""accelreg-emu's stand-in for Ascend's ``torch_npu`` (only with ACCELREG_EMU_NAME=npu).

Importing it brings up the emulated ``torch.npu`` and exports the operators frameworks
import from ``torch_npu``: ``npu_fusion_attention`` (transformers' NPU flash attention),
``npu_rotary_mul`` (transformers' NPU rotary embedding) and ``optim.NpuFusedAdamW``
(transformers' ``adamw_torch_npu_fused`` optimizer).
"""

from __future__ import annotations

import os as _os

from accelreg_emu._shim import bootstrap as _bootstrap

_bootstrap("npu", __name__)

# A real Ascend environment has CANN's variables set (set_env.sh); DeepSpeed's NPU op
# builders read ASCEND_HOME_PATH unconditionally. Point it at this stand-in if unset.
_os.environ.setdefault("ASCEND_HOME_PATH", _os.path.dirname(_os.path.abspath(__file__)))

import torch  # noqa: E402

from accelreg_emu._shim import npu_fusion_attention, npu_rotary_mul, shim_version  # noqa: E402

from . import optim  # noqa: E402

npu = torch.npu
__version__ = shim_version()
__all__ = ["npu", "npu_fusion_attention", "npu_rotary_mul", "optim"]
