"""Lightning's strategies on a registry accelerator: DDP built with the device's own stream module
(no ``torch.cuda.Stream``), the DeepSpeed strategies accepting it (stock: CUDA only), and FSDP's
mixed precision autocasting on its device type (stock: ``"cuda"``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from .accelerator import AUTOCAST_DEVICE, RegistryAccelerator


def _side_stream(device: Any) -> Any:
    """The device's own side stream for building DDP (what Lightning does on its GPU), or none
    when the runtime has no stream module."""
    import torch

    module = getattr(torch, device.type, None)
    stream, make = getattr(module, "stream", None), getattr(module, "Stream", None)
    if stream is None or make is None or device.index is None:
        return contextlib.nullcontext()
    return stream(make(device=device))


def _ddp_wrap(original: Any, ids: str) -> Any:
    """DDP built without ``torch.cuda.Stream`` on a registry accelerator (``ids``: the
    strategy's method that names the device ids)."""

    @functools.wraps(original)
    def wrap(self: Any, module: Any) -> Any:
        if not isinstance(getattr(self, "accelerator", None), RegistryAccelerator):
            return original(self, module)
        device_ids = getattr(self, ids)() if self.root_device.index is not None else None
        ddp = original.__globals__["DistributedDataParallel"]
        with _side_stream(self.root_device) if device_ids is not None else contextlib.nullcontext():
            return ddp(module=module, device_ids=device_ids, **self._ddp_kwargs)

    return wrap


def _setup_model(original: Any) -> Any:
    return _ddp_wrap(original, "determine_ddp_device_ids")


def _setup_module(original: Any) -> Any:
    return _ddp_wrap(original, "_determine_ddp_device_ids")


def _deepspeed_setup_environment(original: Any) -> Any:
    @functools.wraps(original)
    def setup_environment(self: Any) -> None:
        if not isinstance(getattr(self, "accelerator", None), RegistryAccelerator):
            return original(self)
        # Lightning's DeepSpeed strategy refuses every accelerator but its CUDA one; DeepSpeed
        # itself runs on the accelerator install() hands it (the registry's backend), and the
        # process group is the backend's collectives: the rest of the set-up is DDP's, as on CUDA
        strategy = original.__globals__["DeepSpeedStrategy"]
        return super(strategy, self).setup_environment()

    return setup_environment


def _fsdp_forward_context(original: Any) -> Any:
    @functools.wraps(original)
    def forward_context(self: Any) -> Any:
        device_type = getattr(self, AUTOCAST_DEVICE, None)
        if device_type is None or "mixed" not in self.precision:
            return original(self)  # not a registry accelerator's, or no autocast to place
        import torch

        dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
        return torch.autocast(device_type, dtype=dtype)

    return forward_context
