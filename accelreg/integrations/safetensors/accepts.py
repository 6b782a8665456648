"""Which devices the installed safetensors takes: asked of the release itself, never listed here.

safetensors' Rust core parses the device string against a list of its own before torch sees it,
and the list grows release by release (0.4.3: cpu, cuda, npu, xpu, mps; 0.5: mlu and hpu too;
0.8: musa too; none takes ``sdaa`` or a name only its vendor knows). :func:`accepts` opens a
tiny safetensors file (an empty header, written once per question to the temporary folder) with
the device and remembers the answer per device value, so the list accelreg acts on is always the
installed release's.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["accepts", "forget", "probe_file"]

#: A safetensors file with no tensors: the 8-byte header length, then ``{}`` padded to 8 bytes.
_EMPTY = struct.pack("<Q", 8) + b"{}      "

_answers: dict[tuple[Any, Hashable], bool] = {}
_lock = threading.Lock()


class probe_file:
    """A context manager: the path of a fresh empty safetensors file, removed afterwards."""

    def __enter__(self) -> str:
        fd, self.path = tempfile.mkstemp(prefix="accelreg-probe-", suffix=".safetensors")
        with os.fdopen(fd, "wb") as fh:
            fh.write(_EMPTY)
        return self.path

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def accepts(opener: Any, device: Hashable, open_with: Callable[[Any, str, Any], Any]) -> bool:
    """Whether ``opener`` (the release's ``safe_open`` or ``_safe_open_handle``) takes ``device``.

    ``open_with(opener, path, device)`` opens the probe file with it. The answer is remembered
    per ``(opener, device)``. Where the probe cannot run at all (no writable temporary folder),
    the answer is ``True``: the call then goes to safetensors as it would without accelreg.
    """
    key = (opener, device)
    found = _answers.get(key)
    if found is not None:
        return found
    try:
        with probe_file() as path:
            try:
                handle = open_with(opener, path, device)
            except Exception:  # noqa: BLE001 - the release refuses it (SafetensorError, ValueError)
                answer = False
            else:
                answer = True
                handle.__exit__(None, None, None)
    except OSError:
        return True  # no probe file: not ours to decide, and not remembered
    with _lock:
        _answers[key] = answer
    return answer


def forget() -> None:
    """Forget every answer (a test that changes the installed release)."""
    with _lock:
        _answers.clear()
