"""The replacement of safetensors' openers: a registry device the release cannot take is opened
on the cpu and each tensor moved to it as it is read; every other call is the release's own.

``safetensors.safe_open(filename, framework, device=..., *, backend=...)`` and (0.6+)
``safetensors._safe_open_handle(f, framework, device=..., ...)`` are Rust classes. Every torch
entry point of safetensors that takes a device reaches one of them through a module global:
``safetensors.torch.load_file`` calls ``safe_open`` from ``safetensors.torch``'s namespace, and
``load_model`` calls ``load_file`` (0.4.3 to 0.8.0), so the seam replaces ``safe_open`` in every
module that holds it. A call goes to the release untouched unless all of these hold:

* the framework is torch's (``"pt"``, ``"torch"``, ``"pytorch"``);
* the device is a string or :class:`torch.device` (an int is safetensors' cuda index);
* the release refuses it (:func:`~.accepts.accepts` asks the release, with a tiny file);
* its device type is one of the registry's backends (anything else gets the release's own
  error).

Then the device is resolved by the registry (:func:`accelreg.resolve`: an out-of-range index or
an unavailable backend is a :class:`~accelreg.errors.DeviceError`, never a wrong device), the
file is opened on the cpu with the caller's other arguments, and the handle is an
:class:`~.on_device.OnDevice`.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ... import registry
from ...resolution import resolve
from .accepts import accepts
from .on_device import OnDevice

__all__ = ["TORCH_FRAMEWORKS", "open_by_handle", "open_by_path", "registry_device_type"]

#: The framework names safetensors maps to torch.
TORCH_FRAMEWORKS = frozenset({"pt", "torch", "pytorch"})

_MISSING = object()  # an argument the caller did not pass


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, name: str) -> Any:
    if len(args) > position:
        return args[position]
    return kwargs.get(name, _MISSING)


def _on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(args) > 2:
        return (*args[:2], "cpu", *args[3:]), kwargs
    return args, {**kwargs, "device": "cpu"}


def _named_device(device: Any) -> bool:
    """A device string or :class:`torch.device` (not an int, ``None`` or anything else)."""
    if isinstance(device, str):
        return True
    torch = sys.modules.get("torch")  # no torch.device exists before torch is imported
    return torch is not None and isinstance(device, torch.device)


def registry_device_type(device: Any) -> bool:
    """Whether ``device`` (``"emu:1"``, ``torch.device``) names a registry accelerator's device
    type (any registered backend but the cpu)."""
    kind = device.partition(":")[0] if isinstance(device, str) else getattr(device, "type", None)
    if not isinstance(kind, str) or kind in ("", "cpu"):
        return False
    return any(b.device_type == kind for b in registry.get().order)


def _replacement(original: Any, source_name: str, open_with: Any) -> Any:
    @functools.wraps(original, updated=())
    def opener(*args: Any, **kwargs: Any) -> Any:
        device = _argument(args, kwargs, 2, "device")
        framework = _argument(args, kwargs, 1, "framework")
        if (
            not _named_device(device)
            or not isinstance(framework, str)
            or framework not in TORCH_FRAMEWORKS
            or accepts(original, device, open_with)
            or not registry_device_type(device)
        ):
            return original(*args, **kwargs)
        target = resolve(device)  # a DeviceError for a device the registry does not have
        source = _argument(args, kwargs, 0, source_name)
        args, kwargs = _on_cpu(args, kwargs)
        return OnDevice(original(*args, **kwargs), target, source)

    return opener


def _open_path(opener: Any, path: str, device: Any) -> Any:
    return opener(path, "pt", device=device)


def _open_handle(opener: Any, path: str, device: Any) -> Any:
    with open(path, "rb") as fh:
        return opener(fh, "pt", device=device)


def open_by_path(original: Any) -> Any:
    """The replacement of ``safetensors.safe_open`` (``original``)."""
    return _replacement(original, "filename", _open_path)


def open_by_handle(original: Any) -> Any:
    """The replacement of ``safetensors._safe_open_handle`` (``original``): the same, for an open
    file object."""
    return _replacement(original, "f", _open_handle)
