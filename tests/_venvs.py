"""Throwaway virtual environments for tests that must break an installation.

A test that removes pluggy or the accelreg package, or corrupts them, must never touch the
developer's own environment. :func:`throwaway_venv` builds a virtual environment in a folder
the test owns, in a few milliseconds: a ``pyvenv.cfg`` naming the base interpreter, a link to
that interpreter, and a ``site-packages`` whose entries are links to this environment's — all of
them, or all but the ones left out — plus anything the test adds as real files. Python sees a
normal venv (its ``site`` processes the ``.pth`` files there at start-up, twice on 3.11, as in
the real one); breaking something in it is deleting or writing a link or a file of the copy.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["SITE_PACKAGES", "throwaway_venv"]

#: This interpreter's site-packages (where accelreg, its ``.pth`` and its dependencies are).
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def throwaway_venv(
    root: Path,
    *,
    keep: Iterable[str] = ("*",),
    leave_out: Iterable[str] = (),
    add: Mapping[str, str | Path] | None = None,
) -> Path:
    """A virtual environment at ``root``; returns its ``python``.

    Its site-packages links each entry of :data:`SITE_PACKAGES` whose name matches a pattern of
    ``keep`` and none of ``leave_out`` (``fnmatch`` patterns: ``"pluggy*"`` leaves out pluggy and
    its ``.dist-info``). ``add`` maps a name in site-packages to a file's text (``str``) or to a
    folder or file to copy there (``Path``), so it can be changed without touching the original.
    """
    if os.name != "posix":  # pragma: no cover - the layout below is the POSIX one
        raise RuntimeError("throwaway_venv builds POSIX virtual environments only")
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    bindir = root / "bin"
    site = root / "lib" / f"python{version}" / "site-packages"
    bindir.mkdir(parents=True)
    site.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
    )
    python = bindir / "python"
    python.symlink_to(base)
    keep, leave_out = tuple(keep), tuple(leave_out)
    for entry in sorted(SITE_PACKAGES.iterdir()):
        name = entry.name
        if name == "__pycache__":
            continue
        if any(fnmatch.fnmatch(name, p) for p in keep) and not any(
            fnmatch.fnmatch(name, p) for p in leave_out
        ):
            (site / name).symlink_to(entry)
    for name, what in (add or {}).items():
        target = site / name
        if isinstance(what, Path):
            if what.is_dir():
                shutil.copytree(what, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(what, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(what)
    return python
