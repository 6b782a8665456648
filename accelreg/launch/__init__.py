"""Launching jobs: every Python process of a job asks the registry, on the devices chosen.

* :mod:`.startup` — run at interpreter start-up (through ``accelreg-startup.pth``) in every
  Python process whose environment has ``ACCELREG_RUN`` (set by ``accelreg run``) or
  ``ACCELREG_AUTO_INSTALL=1`` (the opt-in for jobs whose command cannot be wrapped): it arranges
  for :func:`accelreg.install` to run the moment the process first imports a host library, so
  launchers, ranks and scheduler workers ask the registry without user code. Elsewhere the
  ``.pth`` line costs one environment lookup.
* :mod:`.masks` — :func:`visible_devices_env` (the variable that makes chosen physical devices a
  job's logical devices 0..n-1, for any backend), :func:`check_devices_exist`, and :func:`run`,
  which applies both and replaces the process with the job's command (``accelreg run``).

This ``__init__`` imports nothing (``startup`` must stay cheap); the public functions are served
from :mod:`.masks` on first use.
"""

from __future__ import annotations

import importlib

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .masks import check_devices_exist, run, visible_devices_env

__all__ = ["check_devices_exist", "run", "visible_devices_env"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.masks"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
