"""A Ray task's mask: the seams on ``ray._private.utils`` that set a task's visible devices for
its units and restore them after, for accelreg's resources (the registry re-reads the
environment whenever Ray sets or restores a mask).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from ... import registry
from ...registry import DEVICE_ID_VAR
from .managers import _records, _vars, log


def _assign(originals: dict[str, str | None]) -> None:
    """After Ray set a task's masks: name the task's device for ``resolve()`` (restored with the
    masks after a task) and make the registry re-read the environment."""
    owners = _vars()
    touched = [var for var in originals if var in owners]
    if not touched:
        return
    specs = _records()[1]
    for var in touched:
        name = owners[var]
        ids, _ = registry.parse_visible(specs[name], os.environ.get(var, ""))
        if ids:
            originals.setdefault(DEVICE_ID_VAR, os.environ.get(DEVICE_ID_VAR))
            os.environ[DEVICE_ID_VAR] = f"{name}={ids[0]}"
            break
    registry.refresh()


def _set_visible_accelerator_ids(original: Any) -> Any:
    @functools.wraps(original)
    def set_visible_accelerator_ids() -> Any:
        originals = original()
        if isinstance(originals, dict):
            try:
                _assign(originals)
            except Exception as exc:  # noqa: BLE001 - never fail a task's start from here
                log.warning("accelreg: could not tell the registry this task's devices: %s", exc)
                registry.refresh()
        return originals

    return set_visible_accelerator_ids


def _reset_visible_accelerator_env_vars(original: Any) -> Any:
    @functools.wraps(original)
    def reset_visible_accelerator_env_vars(original_visible_accelerator_env_vars: Any) -> Any:
        result = original(original_visible_accelerator_env_vars)
        if isinstance(original_visible_accelerator_env_vars, Mapping):
            owners = _vars()
            if any(var in owners or var == DEVICE_ID_VAR for var in original_visible_accelerator_env_vars):
                registry.refresh()
        return result

    return reset_visible_accelerator_env_vars
