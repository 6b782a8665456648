"""Launching jobs: visible-device masks for ranks, and ``accelreg run``.

* :mod:`.masks` — :func:`visible_devices_env` (the variable that makes chosen physical devices a
  job's logical devices 0..n-1, for any backend) and :func:`check_devices_exist`; :func:`run`
  applies a mask and replaces the process with the job's command (``accelreg run``).
"""

from __future__ import annotations

from .masks import check_devices_exist, run, visible_devices_env

__all__ = ["check_devices_exist", "run", "visible_devices_env"]
