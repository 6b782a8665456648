"""accelreg's RuntimeWarnings: each message once per process, pointing at the caller's code.

A warning that repeats on every query is noise, and one whose source line is inside accelreg
says nothing about where the user's code asked. :func:`warn_once` gives each message once
(until :func:`accelreg.reset` forgets them) and attributes it to the first frame outside the
``accelreg`` package.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

__all__ = ["PREFIX", "forget", "warn_once"]

#: Every accelreg warning starts with this, so filters (and the ``accelreg`` command) can tell
#: them apart: ``warnings.filterwarnings("ignore", message="accelreg: ")``.
PREFIX = "accelreg: "

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_given: set[str] = set()
_lock = threading.Lock()


def warn_once(message: str) -> bool:
    """Issue ``message`` (prefixed ``"accelreg: "``) as a RuntimeWarning unless it was already
    given in this process; returns whether it was issued now."""
    text = message if message.startswith(PREFIX) else PREFIX + message
    with _lock:
        if text in _given:
            return False
        _given.add(text)
    warnings.warn(text, RuntimeWarning, stacklevel=_outside())
    return True


def forget() -> None:
    """Forget which warnings were given (``accelreg.reset()`` calls this)."""
    with _lock:
        _given.clear()


def _outside() -> int:
    """The ``stacklevel`` of the first frame outside accelreg, as seen from warn_once."""
    level = 2
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
