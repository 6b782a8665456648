"""accelreg-emu's stand-in for Tecorigin's torch_sdaa (only with ACCELREG_EMU_NAME=sdaa).

Importing it brings up the emulated ``torch.sdaa``; accelerate, transformers, peft and
DeepSpeed only import this package and then use ``torch.sdaa``.
"""

from __future__ import annotations

from accelreg_emu._shim import bootstrap as _bootstrap

_bootstrap("sdaa", __name__)

import torch  # noqa: E402

from accelreg_emu._shim import shim_version  # noqa: E402

sdaa = torch.sdaa
__version__ = shim_version()
__all__ = ["sdaa"]
