"""Launching one process per device: visible-device masks for ranks.

A launcher (torchrun, the DeepSpeed launcher) starts N processes and tells each its
``LOCAL_RANK``; ``accelreg.resolve()`` in each picks logical device ``LOCAL_RANK``. To run on a
chosen subset of physical devices, mask them for the whole job: with
``ASCEND_RT_VISIBLE_DEVICES=0,2`` rank 0 gets physical 0 and rank 1 physical 2 (logical 1).
:func:`visible_devices_env` computes that mask for any backend without knowing its variable,
and ``accelreg run --devices 0,2 -- torchrun ...`` applies it and starts the launcher.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .errors import ConfigError, DeviceError

__all__ = ["visible_devices_env"]


def visible_devices_env(backend: str | None, ids: Sequence[int | str]) -> dict[str, str]:
    """The environment that makes physical devices ``ids`` logical devices 0..n-1 of ``backend``.

    ``backend=None`` means the current backend. The value is checked with the backend's own
    parser, so it is one the runtime accepts. Raises :class:`DeviceError` for a backend that
    has no visible-devices variable and :class:`ConfigError` for bad ids.
    """
    from . import registry
    from .visible import mask_value

    snap = registry.get()
    if backend is None:
        b = snap.current()
    elif not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
    else:
        b = snap.backend(backend)
    var = b.spec.visible_devices_var
    if not var:
        raise DeviceError(f"{b.name} has no visible-devices variable; it cannot be masked per job")
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a sequence of device ids, got {type(ids).__name__}")
    if not ids:
        raise ConfigError("ids is empty: a job needs at least one device")
    value = mask_value(ids)
    parsed, problem = registry.parse_visible(b.spec, value)
    if problem is not None or parsed is None or len(parsed) != len(ids):
        raise ConfigError(f"{var}={value!r} is not accepted by {b.name}: {problem or 'entries were dropped'}")
    return {var: value}


def run(backend: str | None, ids: Sequence[int | str], command: Sequence[str]) -> None:
    """Replace this process with ``command`` under the mask for ``ids`` (never returns)."""
    env = dict(os.environ)
    env.update(visible_devices_env(backend, ids))
    os.execvpe(command[0], list(command), env)
