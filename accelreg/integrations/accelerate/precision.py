"""accelerate's mixed precision on the registry's accelerator: its bf16/fp16 checks answered by
the registry's capability query, and fp16's gradient scaler for the device type it trains on.

* ``is_bf16_available`` / ``is_fp16_available``: a ladder of device types (1.10-1.15) or
  ``torch.accelerator`` (1.16); the replacements answer :func:`accelreg.capabilities` for the
  current backend's device, and keep accelerate's own answer where the registry has none (no
  accelerator, or nobody knows).
* ``Accelerator.__init__`` refuses fp16 on a device type outside its list (1.10-1.15: xpu, cuda,
  npu, xla, mlu, musa, hpu, sdaa, mps) or whose runtime does not list float16 (1.16). When the
  registry says the device computes in float16, the replacement completes the construction
  accelerate refused, as accelerate does for a device it knows: native autocast on the device
  type (``get_mixed_precision_context_manager`` takes the type from the state) and a gradient
  scaler. When the registry says it does not, fp16 is refused with the registry's reason. The
  rest of ``__init__`` after the mixed-precision block is the same in every served release
  (1.10-1.16: the shapes pin it).
* ``get_grad_scaler``: a ladder of device types ending in ``torch.amp.GradScaler("cuda")``
  (1.10-1.15), which torch disables with a warning where there is no CUDA, so fp16 would train
  without loss scaling. The replacement keeps accelerate's scaler when it is for the registry's
  device type (a vendor's own, ``torch.npu.amp.GradScaler``) and otherwise gives
  ``torch.amp.GradScaler(<device type>)``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections import OrderedDict
from typing import Any

from ... import registry
from ...resolution import current_in_use
from .._machinery.precision import accelerator_supports, registry_device_type

__all__ = ["accelerator_init", "get_grad_scaler", "is_bf16_available", "is_fp16_available"]


def is_bf16_available(original: Any) -> Any:
    """The replacement of ``accelerate.utils.imports.is_bf16_available``."""

    @functools.wraps(original)
    def is_bf16_available(ignore_tpu: bool = False) -> bool:
        import torch

        answer = accelerator_supports(torch.bfloat16)  # None on a TPU: not a registry backend
        return original(ignore_tpu) if answer is None else answer

    return is_bf16_available


def is_fp16_available(original: Any) -> Any:
    """The replacement of ``accelerate.utils.imports.is_fp16_available``."""

    @functools.wraps(original)
    def is_fp16_available() -> bool:
        import torch

        answer = accelerator_supports(torch.float16)
        return original() if answer is None else answer

    return is_fp16_available


def get_grad_scaler(original: Any) -> Any:
    """The replacement of ``accelerate.utils.modeling.get_grad_scaler``."""
    kinds = original.__globals__["DistributedType"]

    @functools.wraps(original)
    def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
        import torch

        if distributed_type == kinds.FSDP:
            return original(distributed_type, **kwargs)
        current = current_in_use(registry.get())
        if current.name == "cpu":
            return original(distributed_type, **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = original(distributed_type, **kwargs)
        theirs = getattr(scaler, "_device", current.device_type)
        if not isinstance(scaler, torch.amp.GradScaler) or theirs == current.device_type:
            for w in caught:  # accelerate's scaler stands: so do its warnings
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            return scaler
        # accelerate's ladder has no branch for this backend: its scaler is for another device type
        # (cuda's, which torch disables where there is no CUDA)
        return torch.amp.GradScaler(current.device_type, **kwargs)

    return get_grad_scaler


def _fp16_support(accelerator: Any) -> tuple[bool | None, str]:
    """The registry's answer for float16 on ``accelerator``'s device and its reason
    (``(None, "")`` when the device is not a registry accelerator's)."""
    import torch

    device = getattr(getattr(accelerator, "state", None), "device", None)
    if device is None or registry_device_type(device) is None:
        return None, ""
    answer = accelerator_supports(torch.float16, device)
    if answer is None:
        return None, ""
    from ...queries import capabilities  # at first use, not in install()

    return answer, capabilities(str(device)).support(torch.float16).reason


def _refused_fp16(accelerator: Any, exc: ValueError) -> bool:
    """Whether ``exc`` is accelerate refusing fp16 on a registry device that the registry says
    computes in float16: its refusal names the device type (``requires a GPU (not 'emu')``,
    ``requires a device in [...] (not 'emu')``, ``is not supported on 'emu'``); anything else
    (FSDP2's scaler, a torch release too old for a device, TPU) is accelerate's own."""
    state = getattr(accelerator, "state", None)
    if state is None or state.mixed_precision != "fp16":
        return False
    device_type = getattr(getattr(state, "device", None), "type", None)
    message = str(exc)
    if not message.startswith("fp16 mixed precision") or f"{device_type!r}" not in message:
        return False
    try:
        if accelerator.is_fsdp2:
            return False
    except AttributeError:
        pass
    return _fp16_support(accelerator)[0] is True


def _finish(accelerator: Any, names: dict[str, Any], rng_types: Any) -> None:
    """What ``Accelerator.__init__`` does after its mixed-precision block for fp16 on a device
    it knows (1.10-1.16: the same code in every served release)."""
    accelerator.native_amp = True
    handler = getattr(accelerator, "scaler_handler", None)
    kwargs = handler.to_kwargs() if handler is not None else {}
    accelerator.scaler = names["get_grad_scaler"](accelerator.distributed_type, **kwargs)
    accelerator.step = 0
    accelerator._optimizers = []
    accelerator._models = []
    accelerator._schedulers = []
    accelerator._dataloaders = []
    accelerator._custom_objects = []
    accelerator._load_model_state_pre_hook = OrderedDict()
    accelerator._save_model_state_pre_hook = OrderedDict()
    accelerator.rng_types = rng_types if rng_types is not None else ["generator"]
    accelerator.flag_tensor = None
    names["check_os_kernel"]()


def accelerator_init(original: Any) -> Any:
    """The replacement of ``Accelerator.__init__``."""
    signature = inspect.signature(original)
    names = original.__globals__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except ValueError as exc:
            if not _refused_fp16(self, exc):
                raise
            bound = signature.bind(self, *args, **kwargs)
            _finish(self, names, bound.arguments.get("rng_types"))
            return
        if self.state.mixed_precision == "fp16" and self.native_amp:
            supported, reason = _fp16_support(self)
            if supported is False:
                raise ValueError(f"fp16 mixed precision is not supported on {self.state.device}: {reason}")

    return __init__
