"""Handing back the mapped pages of a tensor once it has been copied to its device.

safetensors memory-maps the file, and a cpu tensor it returns is a view of that mapping: reading
it brings the pages in, and they stay resident (counted in the process's RSS) as long as the
mapping lives — for a handle, until it is closed. A handle that moves each tensor to a device as
it is read therefore holds the whole file in host memory by its end, on top of the copies on the
device. :class:`Mapping` gives a moved tensor's pages back at once (``madvise(MADV_DONTNEED)``
on the whole pages of its bytes), so the host holds about one tensor of the file at a time.

Only pages of a *file* mapping of the file being read are given back (found in
``/proc/self/maps`` by the file's device and inode): such a page is read again from the file if
it is touched later, so nothing is lost. A tensor whose bytes lie anywhere else (a release or
``backend="pread"`` that reads into memory of its own, which is freed with the tensor) is left
alone. Where ``/proc/self/maps`` or ``madvise`` does not exist (not Linux), nothing is given
back: the pages go when the handle is closed, as without accelreg.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

__all__ = ["Mapping"]

_MADV_DONTNEED = 4  # Linux: drop the pages; a file mapping reads them again on the next touch
_PAGE = mmap.PAGESIZE
_MAPS = "/proc/self/maps"


def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise_fn = _madvise()


def _identity(source: Any) -> tuple[int, int] | None:
    """``(device, inode)`` of the file a handle reads: a path, or an open file object."""
    try:
        st = os.fstat(source.fileno()) if hasattr(source, "fileno") else os.stat(source)
    except (OSError, TypeError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _ranges(ident: tuple[int, int]) -> list[tuple[int, int]]:
    """The address ranges where the file ``ident`` is mapped in this process."""
    dev, ino = ident
    out = []
    try:
        with open(_MAPS, encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6 or int(parts[4]) != ino:
                    continue
                major, _, minor = parts[3].partition(":")
                if os.makedev(int(major, 16), int(minor, 16)) != dev:
                    continue
                start, _, end = parts[0].partition("-")
                out.append((int(start, 16), int(end, 16)))
    except (OSError, ValueError):
        return []
    return out


class Mapping:
    """Where one handle's file is mapped; :meth:`release` gives a moved tensor's pages back."""

    __slots__ = ("_ident", "_ranges")

    def __init__(self, source: Any) -> None:
        self._ident = _identity(source) if _madvise_fn is not None else None
        self._ranges: list[tuple[int, int]] | None = None  # read at the first tensor: mapped by then

    def release(self, tensor: Any) -> int:
        """Give back the whole pages of ``tensor``'s bytes if they lie in the file's mapping;
        returns the bytes given back (0 when the tensor is not a view of the mapping)."""
        if self._ident is None:
            return 0
        if self._ranges is None:
            self._ranges = _ranges(self._ident)
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
        end = start + storage.nbytes()
        if not any(lo <= start and end <= hi for lo, hi in self._ranges):
            return 0
        first = -(-start // _PAGE) * _PAGE  # whole pages only: a neighbour's bytes share the edges
        last = end // _PAGE * _PAGE
        if last <= first:
            return 0
        if _madvise_fn(first, last - first, _MADV_DONTNEED) != 0:
            return 0
        return last - first
