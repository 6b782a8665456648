"""Stand-in for ``habana_frameworks.torch``: importing it brings up the emulated ``torch.hpu``.

The emulated devices use torch's in-tree HPU device type (``torch.device("hpu")``), so
tensors print and dispatch as HPU tensors. Exports ``hpu``, ``core`` and ``utils`` as the
real package does (accelerate, transformers and DeepSpeed import them).
"""

from __future__ import annotations

from accelreg_emu._shim import shim_version

from . import _active, core, hpu, utils  # noqa: F401

__version__ = shim_version()
__all__ = ["core", "hpu", "utils"]
