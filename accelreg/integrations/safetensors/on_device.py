"""A safetensors handle opened on the cpu whose tensors arrive on a registry device.

:class:`OnDevice` wraps the handle the release opened on the cpu (memory-mapped): each tensor is
moved to the device as it is read, and its mapped pages are given back
(:class:`~.pages.Mapping`), so host memory holds about one tensor of the file at a time and the
file is never copied whole to the host. It answers what the release's handle answers — ``keys``,
``metadata``, ``offset_keys``, ``get_tensor``, ``get_slice`` (whose slices arrive on the device
too), ``get_tensors`` where the release has it, and the context manager — and nothing else: a
method this wrapper does not know would hand out cpu tensors, so it is an ``AttributeError``
naming the device, never a silent cpu tensor.
"""

from __future__ import annotations

from typing import Any

from .pages import Mapping

__all__ = ["OnDevice", "SliceOnDevice"]

#: Methods of the release's handle that return no tensor: passed through as they are.
_PLAIN = frozenset({"keys", "metadata", "offset_keys"})
#: Methods of the release's slice that return no tensor.
_PLAIN_SLICE = frozenset({"get_shape", "get_dtype"})


def _refuse(kind: str, name: str, device: Any) -> AttributeError:
    return AttributeError(
        f"{kind}.{name} is not available on a safetensors file that accelreg opened on the cpu for "
        f"{device} (a device this safetensors release does not take): accelreg moves the tensors "
        "of get_tensor, get_slice and get_tensors to the device, and knows nothing of "
        f"{name!r}; open the file with device='cpu' and move its tensors yourself"
    )


class OnDevice:
    """The release's cpu handle ``handle`` of ``source`` (a path or file object), whose tensors
    arrive on ``device`` (a :class:`torch.device`)."""

    def __init__(self, handle: Any, device: Any, source: Any) -> None:
        self._handle = handle
        self.device = device
        self._mapping = Mapping(source)

    def _moved(self, cpu: Any) -> Any:
        out = cpu.to(self.device)
        if out is not cpu:
            self._mapping.release(cpu)
        return out

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``, on the device."""
        return self._moved(self._handle.get_tensor(name))

    def get_slice(self, name: str) -> SliceOnDevice:
        """A slice of tensor ``name`` whose ``[...]`` arrives on the device."""
        return SliceOnDevice(self._handle.get_slice(name), self)

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, on the device, read one at a time in file order (the release's
        ``get_tensors``, which safetensors 0.8 added, would hold them all on the cpu at once)."""
        if not hasattr(self._handle, "get_tensors"):
            raise AttributeError(f"{type(self._handle).__name__!r} object has no attribute 'get_tensors'")
        names = self._handle.offset_keys() if hasattr(self._handle, "offset_keys") else self._handle.keys()
        return {name: self.get_tensor(name) for name in names}

    def __enter__(self) -> OnDevice:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._handle.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        if name in _PLAIN:
            return getattr(self._handle, name)
        raise _refuse(type(self._handle).__name__, name, self.device)

    def __repr__(self) -> str:
        return f"<safetensors handle on {self.device} through the cpu (accelreg): {self._handle!r}>"


class SliceOnDevice:
    """The release's slice of one tensor, whose ``[...]`` arrives on the device."""

    def __init__(self, piece: Any, owner: OnDevice) -> None:
        self._piece = piece
        self._owner = owner

    def __getitem__(self, index: Any) -> Any:
        return self._owner._moved(self._piece[index])

    def __getattr__(self, name: str) -> Any:
        if name in _PLAIN_SLICE:
            return getattr(self._piece, name)
        raise _refuse(type(self._piece).__name__, name, self._owner.device)
