"""Launching jobs: every Python process of a job asks the registry, on the devices chosen.

* :mod:`.startup` — run at interpreter start-up (through ``accelreg-startup.pth``) in every
  Python process whose environment has ``ACCELREG_RUN`` (set by ``accelreg run``) or
  ``ACCELREG_AUTO_INSTALL=1`` (the opt-in for jobs whose command cannot be wrapped): it arranges
  for :func:`accelreg.install` to run the moment the process first imports a host library, so
  launchers, ranks and scheduler workers ask the registry without user code. Elsewhere the
  ``.pth`` line costs two environment lookups.
* :mod:`.masks` — :func:`visible_devices_env` (the variable that makes chosen physical devices a
  job's logical devices 0..n-1, for any backend) and :func:`check_devices_exist`.
* :mod:`.job` — :func:`run`, which applies both when devices are given and replaces the process
  with the job's command (``accelreg run``); without devices it loads no registry.

This ``__init__`` imports nothing (``startup`` must stay cheap); the public functions are served
from their modules on first use.
"""

from __future__ import annotations

import importlib

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .job import run
    from .masks import check_devices_exist, visible_devices_env

__all__ = ["check_devices_exist", "run", "visible_devices_env"]

_HOME = {"check_devices_exist": "masks", "run": "job", "visible_devices_env": "masks"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
