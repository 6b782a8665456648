"""accelreg-emu's stand-in for Moore Threads' torch_musa (only with ACCELREG_EMU_NAME=musa).

Importing it brings up the emulated ``torch.musa``; accelerate, transformers, peft and
DeepSpeed only import this package and then use ``torch.musa``.
"""

from __future__ import annotations

from accelreg_emu._shim import bootstrap as _bootstrap

_bootstrap("musa", __name__)

import torch  # noqa: E402

from accelreg_emu._shim import shim_version  # noqa: E402

musa = torch.musa
__version__ = shim_version()
__all__ = ["musa"]
