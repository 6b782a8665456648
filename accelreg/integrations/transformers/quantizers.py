"""Quantizers at load time: bitsandbytes refused on a device its placement rules do not allow
(never a silent wrong device), and the placement hooks attached after a quantized load.

Whether bitsandbytes runs on a device is the placement rule's answer for the device's backend
and the method (:func:`accelreg.placement_rule`: the built-in rules probe bitsandbytes' own
kernels on the device, and a plugin's rule may say more), never bitsandbytes' list of device
names: its default kernels run on a device no list has heard of.
"""

from __future__ import annotations

import functools
from typing import Any

from ...errors import PlacementError
from ...resolution import resolve


def _check_bnb_device(device: Any, where: str, quant_method: str = "bnb_8bit") -> None:
    """Raise :class:`~accelreg.PlacementError` when bitsandbytes does not run ``quant_method``
    (``"bnb_8bit"``, ``"bnb_4bit"``) on ``device``, as its placement rule says."""
    from ... import placement

    try:
        placement.placement_rule(placement.backend_of(device), quant_method)
    except PlacementError as exc:
        raise PlacementError(
            f"{exc}; {where} is {device}: pass device_map='cpu' to quantize on the CPU, or choose another backend"
        ) from None


def _bnb_method(hf_quantizer: Any) -> str | None:
    """``"bnb_8bit"`` / ``"bnb_4bit"`` for a bitsandbytes quantizer, else ``None``."""
    config = getattr(hf_quantizer, "quantization_config", None)
    method = getattr(config, "quant_method", None)
    if "bitsandbytes" not in str(getattr(method, "value", method) or ""):
        return None
    return "bnb_8bit" if getattr(config, "load_in_8bit", False) else "bnb_4bit"


def _refuse_unsupported_bnb(hf_quantizer: Any, device_map: dict[str, Any]) -> None:
    """The check of a default bitsandbytes map, for planned and user-written maps too: a
    bitsandbytes load onto a device bitsandbytes does not run on is refused."""
    import torch

    method = _bnb_method(hf_quantizer)
    if method is None:
        return
    for key, value in device_map.items():
        if str(value) not in ("cpu", "disk", "meta"):
            _check_bnb_device(torch.device(value), f"device_map[{key!r}]", method)


def _update_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def update_device_map(self: Any, device_map: Any) -> Any:
        if device_map is not None:
            return device_map

        device = resolve()
        _check_bnb_device(device, "the registry's device", _bnb_method(self) or "bnb_8bit")
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
