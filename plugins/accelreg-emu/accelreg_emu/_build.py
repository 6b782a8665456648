"""Building and loading the C++ extension.

The extension is compiled on first use with :func:`torch.utils.cpp_extension.load` into a
cache directory keyed by the torch version and a hash of the sources, so a warm start only
loads a shared library. Concurrent first uses are safe: builders serialise on an ``flock``
(released by the kernel if a builder dies), each builds in a private directory, and the
finished library is moved into place atomically.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

__all__ = ["cache_root", "library_path", "load_library"]

_CSRC = Path(__file__).resolve().parent / "csrc"
_MAIN_SOURCE = "accelreg_emu.cpp"
_loaded: dict[str, Path] = {}


def cache_root() -> Path:
    """``$ACCELREG_EMU_CACHE``, else ``$XDG_CACHE_HOME/accelreg-emu``, else ``~/.cache/accelreg-emu``."""
    explicit = os.environ.get("ACCELREG_EMU_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "accelreg-emu"


def _lib_name(variant: str) -> str:
    return f"accelreg_emu_{variant}"


def _flags(variant: str) -> list[str]:
    return ["-DACCELREG_EMU_HPU"] if variant == "hpu" else []


def _build_key(variant: str) -> str:
    import torch

    digest = hashlib.sha256()
    for path in sorted(_CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    digest.update(repr((variant, _flags(variant), sys.version_info[:2], torch.__version__)).encode())
    return f"{torch.__version__}-{digest.hexdigest()[:16]}"


def library_path(variant: str = "privateuse1") -> Path:
    """Where the built library for ``variant`` (``privateuse1`` or ``hpu``) lives."""
    return cache_root() / _build_key(variant) / f"{_lib_name(variant)}.so"


def _build(variant: str, target: Path) -> None:
    from torch.utils import cpp_extension

    scratch = target.parent.with_name(f"{target.parent.name}.build-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    started = time.monotonic()
    print(
        f"accelreg-emu: building the {variant} extension into {target.parent} (first use only)...",
        file=sys.stderr,
        flush=True,
    )
    try:
        built = cpp_extension.load(
            name=_lib_name(variant),
            sources=[str(_CSRC / _MAIN_SOURCE)],
            extra_cflags=_flags(variant),
            build_directory=str(scratch),
            is_python_module=False,
            verbose=bool(os.environ.get("ACCELREG_EMU_VERBOSE")),
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(built if isinstance(built, str) else scratch / target.name, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"accelreg-emu: built in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def load_library(variant: str = "privateuse1") -> Path:
    """Build (first use) and load the extension into this process; idempotent.

    Returns the path of the loaded library.
    """
    if variant in _loaded:
        return _loaded[variant]
    import torch

    target = library_path(variant)
    if not target.exists():
        target.parent.parent.mkdir(parents=True, exist_ok=True)
        lock_path = target.parent.with_name(f"{target.parent.name}.lock")
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not target.exists():
                    # cpp_extension.load also loads what it built, from the scratch path.
                    _build(variant, target)
                    _loaded[variant] = target
                    return target
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    torch.ops.load_library(str(target))
    _loaded[variant] = target
    return target
