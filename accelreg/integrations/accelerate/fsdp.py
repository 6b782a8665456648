"""accelerate's FSDP plugin on a registry accelerator (accelerate 1.10-1.15).

``FullyShardedDataParallelPlugin.__post_init__`` picks the device that ``sync_module_states``
initialises parameters on with a ladder of the device types it knows (npu, mlu, musa, cuda, xpu,
hpu, and neuron from 1.14), and ends in ``RuntimeError: There are currently no available devices
found``: FSDP through accelerate (``accelerate launch --use_fsdp``, whose plugin syncs module
states by default) failed on every other registry backend. Where the ladder finds nothing and the
registry's current backend is an accelerator, the replacement finishes what the ladder started,
as accelerate 1.16 does through ``torch.accelerator``: parameters are initialised on that
backend's device type, the index resolved when FSDP wraps the module, after each rank has
selected its device. Everything else (the ladder's own answer, no accelerator, any other error)
is accelerate's.
"""

from __future__ import annotations

import functools
from typing import Any

from ... import registry
from ...resolution import current_in_use

__all__ = ["NO_DEVICE", "fsdp_plugin_post_init"]

#: How accelerate 1.10-1.15 begins the error its ladder ends in.
NO_DEVICE = "There are currently no available devices found"


def fsdp_plugin_post_init(original: Any) -> Any:
    """The replacement of ``FullyShardedDataParallelPlugin.__post_init__`` (``original``)."""

    @functools.wraps(original)
    def __post_init__(self: Any) -> None:
        try:
            original(self)
        except RuntimeError as exc:
            if not str(exc).startswith(NO_DEVICE) or not self.sync_module_states:
                raise
            current = current_in_use(registry.get())
            if current.name == "cpu":
                raise
            import torch

            device = torch.device(current.device_type)  # the rank's index, when FSDP wraps
            self.param_init_fn = lambda module: module.to_empty(device=device, recurse=False)

    return __post_init__
