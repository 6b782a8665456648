"""The shapes of live functions, computed once per release and remembered on disk.

Matching a seam's adapters needs the :func:`~.shapes.shape` of the library's function: its source
read, parsed and hashed, a few milliseconds each, in every process of a job that imports the
library. A function's shape changes only with its source file, so it is remembered by that file
(its path, size and modification time, and the function's name and first line): the first
process to see a release computes it, every later process reads it back.

The cache is a JSON file in ``$ACCELREG_CACHE_DIR``, else ``$XDG_CACHE_HOME/accelreg``, else
``~/.cache/accelreg``. It is written atomically (a rank starting beside others reads a whole
file or none) and only when a new shape was computed; a cache that cannot be read or written
is ignored (each process then computes what it needs, as without one).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .shapes import fingerprint, shape

__all__ = ["CACHE_VAR", "cache_file", "digests", "forget", "save"]

#: Where the cache lives, when set (a folder).
CACHE_VAR = "ACCELREG_CACHE_DIR"
#: Bumped when :func:`~.shapes.shape` changes what it hashes: an older file is not read.
_FORMAT = 1

_lock = threading.Lock()
_memory: dict[str, list[str]] | None = None
_dirty = False


def cache_file() -> Path:
    """The cache file of this process's settings."""
    base = os.environ.get(CACHE_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "accelreg"
    )
    return Path(base) / f"shapes-{_FORMAT}.json"


def _key(func: Any) -> str | None:
    """The function's identity in the cache: its source file's path, size and modification
    time, its qualified name and first line (``None`` for a function without a source file)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    try:
        stat = os.stat(code.co_filename)
    except (OSError, ValueError):
        return None
    qualname = getattr(func, "__qualname__", code.co_name)
    return f"{code.co_filename}|{stat.st_size}|{stat.st_mtime_ns}|{qualname}|{code.co_firstlineno}"


def _load() -> dict[str, list[str]]:
    global _memory
    if _memory is None:
        try:
            data = json.loads(cache_file().read_text(encoding="utf-8"))
            _memory = {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 2}
        except (OSError, ValueError, AttributeError):
            _memory = {}
    return _memory


def digests(func: Any) -> tuple[str, str]:
    """``(shape(func), fingerprint(func))``, from the cache where the function's source file is
    the one the cache saw."""
    global _dirty
    key = _key(func)
    if key is None:
        return shape(func), fingerprint(func)
    with _lock:
        known = _load().get(key)
    if known is not None:
        return known[0], known[1]
    found = shape(func), fingerprint(func)
    with _lock:
        _load()[key] = list(found)
        _dirty = True
    return found


def save() -> None:
    """Write the shapes computed in this process (no-op when nothing is new). Entries whose
    source file changed or went away are dropped, so the file holds the releases installed."""
    global _dirty
    with _lock:
        if not _dirty or _memory is None:
            return
        entries = {k: v for k, v in _memory.items() if _still_there(k)}
        _dirty = False
    target = cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps(entries, separators=(",", ":")), encoding="utf-8")
        os.replace(temporary, target)
    except OSError:
        pass  # an unwritable cache: each process computes its shapes, as without one


def _still_there(key: str) -> bool:
    path, size, mtime, _name, _line = key.rsplit("|", 4)
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return str(stat.st_size) == size and str(stat.st_mtime_ns) == mtime


def forget() -> None:
    """Drop what this process read or computed (tests that point the cache elsewhere)."""
    global _memory, _dirty
    with _lock:
        _memory, _dirty = None, False
