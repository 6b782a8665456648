"""accelreg-emu's stand-in for Cambricon's torch_mlu (only with ACCELREG_EMU_NAME=mlu).

Importing it brings up the emulated ``torch.mlu``; accelerate, transformers, peft and
DeepSpeed only import this package and then use ``torch.mlu``.
"""

from __future__ import annotations

from accelreg_emu._shim import bootstrap as _bootstrap

_bootstrap("mlu", __name__)

import types  # noqa: E402

import torch  # noqa: E402

from accelreg_emu._shim import shim_version  # noqa: E402

mlu = torch.mlu
if not hasattr(mlu, "cnpx"):
    # Cambricon's profiler ranges (NVTX's counterpart): DeepSpeed's MLU accelerator marks every
    # forward with them. Nothing records them here.
    mlu.cnpx = types.ModuleType("torch.mlu.cnpx", "Profiler ranges of the emulated mlu (no-ops).")
    mlu.cnpx.range_push = lambda msg: 0
    mlu.cnpx.range_pop = lambda: 0
__version__ = shim_version()
__all__ = ["mlu"]


def fused_adam(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("accelreg-emu: torch_mlu.fused_adam is not emulated")
