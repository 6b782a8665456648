"""Quantizers at load time: bitsandbytes refused on a device its placement rules do not allow
(never a silent wrong device), and the placement hooks attached after a quantized load.
"""

from __future__ import annotations

import functools
from typing import Any

from ...errors import PlacementError
from ...resolution import resolve


def _check_bnb_device(device: Any, where: str) -> None:
    """Raise :class:`~accelreg.PlacementError` when bitsandbytes does not run on ``device``."""
    import bitsandbytes

    supported = getattr(bitsandbytes, "supported_torch_devices", None)
    if supported is not None and device.type not in supported:
        raise PlacementError(
            f"bitsandbytes {getattr(bitsandbytes, '__version__', '')} cannot run on {device.type} "
            f"(it supports {', '.join(sorted(supported))}); {where} is {device}: "
            "pass device_map='cpu' to quantize on the CPU, or choose another backend"
        )


def _refuse_unsupported_bnb(hf_quantizer: Any, device_map: dict[str, Any]) -> None:
    """The check of a default bitsandbytes map, for planned and user-written maps too: a
    bitsandbytes load onto a device type bitsandbytes does not support is refused."""
    import torch

    config = getattr(hf_quantizer, "quantization_config", None)
    method = getattr(config, "quant_method", None)
    if "bitsandbytes" not in str(getattr(method, "value", method) or ""):
        return
    for key, value in device_map.items():
        if str(value) not in ("cpu", "disk", "meta"):
            _check_bnb_device(torch.device(value), f"device_map[{key!r}]")


def _update_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def update_device_map(self: Any, device_map: Any) -> Any:
        if device_map is not None:
            return device_map

        device = resolve()
        _check_bnb_device(device, "the registry's device")
        return {"": str(device)}

    return update_device_map


def _postprocess_model(original: Any) -> Any:
    @functools.wraps(original)
    def postprocess_model(self: Any, model: Any, **kwargs: Any) -> Any:

        from ... import placement

        result = original(self, model, **kwargs)
        placement.attach(model)
        return result

    return postprocess_model
