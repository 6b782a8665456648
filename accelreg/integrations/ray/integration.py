"""The ray row's integration: Ray Core's seams (the accelerator managers' list and lookup, a task's
mask, the raylets a process starts), and what ``accelreg env`` shows."""

from __future__ import annotations

from typing import Any

from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam
from .managers import (
    _ACCELERATORS,
    _UTILS,
    ENABLED,
    _get_accelerator_manager_for_resource,
    _get_all_accelerator_managers,
    _groups,
    _lists_managers,
    _lock,
    _state,
    _visible_ids,
    log,
    manager_for,
    resources,
)
from .masks import _reset_visible_accelerator_env_vars, _set_visible_accelerator_ids
from .raylet import _SERVICES, _start_raylet

__all__ = [
    "INTEGRATION",
    "disable",
    "enable",
    "enabled",
    "manager_for",
    "resources",
]


#: How the shapes were chosen: the list, the lookup and start_raylet change with every release
#: (a manager added, a parameter added) while the wrappers only need what they return and
#: take, so those match by parameters and behaviour; the two mask functions are small private
#: functions whose contract (a dict of each variable's previous value) the wrappers rely on,
#: so they match the shapes of the releases tested (docs/compatibility.md).
_SET_VISIBLE = (
    "97e23a5773ccd0f9",  # 2.50-2.55: RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO defaults to on
    "f2dbb48b3a2f0f22",  # 2.56-2.57: off by default
    "a9c85a1007a11035",  # 2.58-2.60: off; accelerators without a variable are skipped
)
_RESET_VISIBLE = ("2d14787e9d42ff60",)  # 2.50-2.60


def _on_enable() -> None:
    """Record this process's own masks of accelreg's resources as Ray's worker does for its own
    (``original_visible_accelerator_ids``, read when ``ray`` is imported, before this integration
    is enabled): Ray maps a task's unit ids through them, so a node started under a mask (``accelreg
    run --devices 1 -- ray start``) hands out its physical device 1, never device 0."""
    import ray._private.worker as ray_worker

    ENABLED[0] = True

    original = getattr(ray_worker.global_worker, "original_visible_accelerator_ids", None)
    if not isinstance(original, dict):
        return
    for resource in _groups():
        if original.get(resource) is None:
            try:
                original[resource] = _visible_ids(resource)
            except ValueError as exc:  # a malformed mask: Ray's worker would have raised the same
                log.warning("accelreg: %s", exc)


def _on_disable() -> None:
    ENABLED[0] = False
    with _lock:
        _state.clear()


def _status(integ: Integration, out: dict[str, Any]) -> None:
    """Which Ray resources the registry's backends are offered as (``accelreg env``)."""
    if integ.version() is None:
        return
    try:
        groups = _groups()
    except Exception as exc:  # noqa: BLE001 - a status line must not raise
        out["note"] += f"; Ray resources: unknown ({type(exc).__name__}: {exc})"
        return
    out["resources"] = {r: list(names) for r, names in groups.items()}
    listed = ", ".join(f"{r} ({'/'.join(names)})" for r, names in groups.items())
    out["note"] += f"; offers the registry's backends to Ray as {listed or 'nothing'}"


#: The releases Ray Core's seams (and Ray Train's, in ray_train.py) serve, and the matrix runs.
ROW = table.row("ray")
RELEASES = ROW.releases
TESTED = ROW.tested

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            _ACCELERATORS,
            "get_all_accelerator_managers",
            why="add an accelerator manager for each backend of the registry (Ray's list is fixed)",
            adapters=(Adapter(RELEASES, _get_all_accelerator_managers, params=(), probe=_lists_managers),),
            instead="start Ray with the devices declared by hand: ray start --resources '{\"NPU\": 2}'",
        ),
        Seam(
            _ACCELERATORS,
            "get_accelerator_manager_for_resource",
            why="answer a registry backend's resource with accelreg's manager (Ray's own where it finds devices)",
            adapters=(Adapter(RELEASES, _get_accelerator_manager_for_resource, params=("resource_name",)),),
            instead="start Ray with the devices declared by hand and set the visible-devices variable in each task",
        ),
        Seam(
            _UTILS,
            "set_visible_accelerator_ids",
            why="name the task's device for resolve() and make the registry see the task's mask",
            adapters=(Adapter(RELEASES, _set_visible_accelerator_ids, shapes=_SET_VISIBLE),),
            instead="call accelreg.registry.refresh() at the start of each task",
        ),
        Seam(
            _UTILS,
            "reset_visible_accelerator_env_vars",
            why="make the registry see the worker's mask again after a task",
            adapters=(
                Adapter(
                    RELEASES,
                    _reset_visible_accelerator_env_vars,
                    shapes=_RESET_VISIBLE,
                    params=("original_visible_accelerator_env_vars",),
                ),
            ),
            instead="call accelreg.registry.refresh() at the start of each task",
        ),
        Seam(
            _SERVICES,
            "start_raylet",
            why="the raylet's workers install accelreg (ACCELREG_AUTO_INSTALL=1); report failing backends",
            adapters=(Adapter(RELEASES, _start_raylet, params=("env_updates",)),),
            instead="start the node with accelreg run -- ray start ..., or set ACCELREG_AUTO_INSTALL=1 for it",
        ),
    ],
    scan_prefixes=("ray",),
    on_enable=_on_enable,
    on_disable=_on_disable,
    add_status=_status,
)

enable, disable, enabled = INTEGRATION.api()
