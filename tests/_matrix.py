"""Name matrices: one emulated name in the default run, every other name in the full run.

A check that runs under several emulated names (``npu``, ``mlu``, ``musa``, ...) needs one child
process per name (PrivateUse1 is renamed once per process), each paying for torch, the
emulator and the libraries. The first name covers a change to core code; the others are marked
``slow`` (``python -m pytest --full`` and CI run them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

__all__ = ["emu_names"]


def emu_names(names: Iterable[str], mark: Callable[[str], Any] | None = None) -> list[Any]:
    """``pytest.param`` per name, each with ``mark(name)`` (an ``accelreg_emu`` marker, say);
    every name after the first is also ``slow``."""
    out = []
    for i, name in enumerate(names):
        marks = [mark(name)] if mark is not None else []
        if i:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(name, marks=marks, id=name))
    return out
