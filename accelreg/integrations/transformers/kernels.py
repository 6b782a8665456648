"""Hub kernels: transformers 5.25 kernelizes by default; a device type the kernels cannot run on
keeps torch's layers (``hub_kernels_support``).
"""

from __future__ import annotations

import functools
from typing import Any

from ...resolution import qualify
from .device_map import _load, log


@functools.cache
def hub_kernels_support(device_type: str) -> bool:
    """Whether the installed ``kernels`` library accepts ``device_type`` (a torch device type):
    its public ``kernelize`` is run on an empty module for that type (a behaviour probe, no list
    of names).

    ``False`` also when ``kernels`` is not installed. The patch-free path uses it too: where it
    is ``False`` on a transformers that kernelizes by default (5.25), pass
    ``from_pretrained(..., use_kernels=False)`` (or set ``USE_HUB_KERNELS=0``).
    """
    try:
        import kernels
        import torch
    except ImportError:
        return False
    try:
        kernels.kernelize(torch.nn.Module(), mode=kernels.Mode.INFERENCE, device=device_type)
    except ValueError:
        return False
    except Exception as exc:  # noqa: BLE001 - an unforeseen answer: let upstream speak for itself
        log.debug("kernels.kernelize probe for %r raised %s: %s", device_type, type(exc).__name__, exc)
    return True


def _kernels_device_type(model: Any, device_map: dict[str, Any] | None) -> str:
    """The device type transformers' kernelize works on: the first accelerator of the map,
    else the model's device."""
    import torch

    for value in (device_map or {}).values():
        if str(value) not in ("cpu", "disk", "meta"):
            return torch.device(value).type
    return torch.device(model.device).type


def _kernelize(original: Any) -> Any:
    @functools.wraps(original)
    def kernelize(
        model: Any, mode: Any = None, kernel_config: Any = None, device_map: Any = None, **more: Any
    ) -> Any:

        if isinstance(device_map, dict):  # an int is an index of the registry's backend, not a device
            device_map = {k: qualify(v) if isinstance(v, int) else v for k, v in device_map.items()}
        load = _load.get()
        if load is not None and not load.kernels_asked:  # transformers' default, not a request
            device_type = _kernels_device_type(model, device_map)
            if not hub_kernels_support(device_type):
                log.info(
                    "the kernels library does not run on %r: %s keeps its torch layers "
                    "(from_pretrained(use_kernels=True) asks for kernels anyway)",
                    device_type,
                    type(model).__name__,
                )
                return None
        return original(model, mode=mode, kernel_config=kernel_config, device_map=device_map, **more)

    return kernelize


_HK = "transformers.integrations.hub_kernels"
