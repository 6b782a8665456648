"""Ray's accelerator managers, built from the registry: every backend of the registry that has a
visible-devices variable is a Ray resource (its name, its count on a node, its variable), and
the list and lookup seams (``ray._private.accelerators``) hand Ray those managers.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

from ... import flags, registry
from ...registry.probing import package_installed
from ...types import BackendSpec

log = logging.getLogger("accelreg.integrations.ray")


_ACCELERATORS = "ray._private.accelerators"


_UTILS = "ray._private.utils"


_lock = threading.RLock()


#: Per process, dropped by disable(): ``records`` (resource -> backend names, and backend ->
#: spec), ``managers`` (resource -> manager class), ``vars`` (visible-devices variable -> backend),
#: ``takes_over`` (resource -> whether accelreg's manager replaces Ray's), ``chosen`` (resource ->
#: backend picked), ``warned`` (backends whose failure was reported).
_state: dict[str, Any] = {}
#: Whether the integration is enabled here (set by its ``on_enable``, cleared by ``on_disable``).
ENABLED = [False]


# -- the registry's view -------------------------------------------------------------------
# Everything a task's start and end use is read once per process from the plugins' records
# (frozen copies, valid whatever the environment): the per-task path never rebuilds the
# registry (a rebuild loads the plugins: ~30 ms), it only drops it (registry.refresh()).
def _records() -> tuple[dict[str, tuple[str, ...]], dict[str, BackendSpec]]:
    """``(groups, specs)``: resource name -> the registered backends offered under it (registry
    order: every backend but cpu that has a visible-devices variable, since one without cannot
    be isolated per task), and backend name -> its spec (every backend). Probes nothing."""
    with _lock:
        records = _state.get("records")
        if records is None:
            found: dict[str, list[str]] = {}
            specs: dict[str, BackendSpec] = {}
            for b in registry.get().order:
                specs[b.name] = b.spec
                if b.name != "cpu" and b.spec.visible_devices_var:
                    found.setdefault(b.spec.ray_resource_name, []).append(b.name)
            records = _state["records"] = ({r: tuple(n) for r, n in found.items()}, specs)
        return records


def _groups() -> dict[str, tuple[str, ...]]:
    return _records()[0]


def _vars() -> dict[str, str]:
    """Visible-devices variable -> backend name, for every registered backend."""
    with _lock:
        found = _state.get("vars")
        if found is None:
            found = {}
            for name, spec in _records()[1].items():
                var = spec.visible_devices_var
                if var and var not in found:
                    found[var] = name
            _state["vars"] = found
        return found


def _installed(spec: BackendSpec) -> bool:
    package = spec.runtime_package
    if not package:
        return False
    try:
        return package_installed(package)
    except Exception:  # noqa: BLE001 - a broken install is not one to hand devices to
        return False


def _pick(resource: str, *, probe: bool = False) -> str:
    """The backend behind ``resource`` in this process. One backend: it. Several (two plugins
    offering the same resource): with ``probe`` (at node start), the first available; else the
    first whose runtime package is installed, else the first. Remembered per process."""
    names = _groups()[resource]
    if len(names) == 1:
        return names[0]
    chosen = _state.setdefault("chosen", {})
    if resource in chosen:
        return chosen[resource]
    if probe:
        snap = registry.get()
        for name in names:
            if snap.backend(name).available:
                chosen[resource] = name
                return name
    guessed = _state.setdefault("guessed", {})
    if resource not in guessed:
        specs = _records()[1]
        guessed[resource] = next((n for n in names if _installed(specs[n])), names[0])
    return guessed[resource]


def _spec(resource: str) -> BackendSpec:
    return _records()[1][_pick(resource)]


def _report_failing(resource: str) -> None:
    """Warn (once per backend and process) about each backend offered as ``resource`` that is
    present on this node but failing: it gives Ray 0 units, never one that is not there."""
    snap = registry.get()
    warned = _state.setdefault("warned", set())
    for name in _groups().get(resource, ()):
        b = snap.backend(name)
        if b.available or name in warned:
            continue
        why = b.presence()
        if why is None:
            continue
        warned.add(name)
        snap.warn(
            f"accelreg: {name} is present on this Ray node ({why}) but unavailable: "
            f"{b.probe().availability.reason}; Ray gets 0 {resource} units from it "
            f"(`accelreg env` on the node shows why)"
        )


def _node_count(resource: str) -> int:
    b = registry.get().backend(_pick(resource, probe=True))
    _report_failing(resource)
    return b.count if b.available else 0


def _visible_ids(resource: str) -> list[str] | None:
    spec = _spec(resource)
    var = spec.visible_devices_var
    assert var is not None
    value = os.environ.get(var)
    if value is None:
        return None
    ids, problem = registry.parse_visible(spec, value)
    if problem is not None or ids is None:
        raise ValueError(f"{var}={value!r} is not a mask {spec.name} accepts: {problem}")
    return list(ids)


def _set_visible(resource: str, ids: list[Any]) -> None:
    var = _spec(resource).visible_devices_var
    assert var is not None
    if flags.env_switch(f"RAY_EXPERIMENTAL_NOSET_{var}"):
        return  # Ray's own opt-out, spelled for this variable
    os.environ[var] = ",".join(str(i) for i in ids)


# -- the managers --------------------------------------------------------------------------
def _make_manager(resource: str) -> type:
    """An accelerator manager (Ray's ``AcceleratorManager`` interface) for ``resource``,
    answering from the registry."""
    from ray._private.accelerators.accelerator import AcceleratorManager

    def env_var() -> str | None:
        return _spec(resource).visible_devices_var

    body = {
        "__doc__": f"accelreg's manager of the Ray resource {resource!r} (from the registry).",
        "__module__": __name__,
        "get_resource_name": staticmethod(lambda: resource),
        "get_visible_accelerator_ids_env_var": staticmethod(env_var),
        "get_current_node_num_accelerators": staticmethod(lambda: _node_count(resource)),
        "get_current_node_accelerator_type": staticmethod(lambda: None),
        "get_current_node_additional_resources": staticmethod(lambda: None),
        "validate_resource_request_quantity": staticmethod(lambda quantity: (True, None)),
        "get_current_process_visible_accelerator_ids": staticmethod(lambda: _visible_ids(resource)),
        "set_current_process_visible_accelerator_ids": staticmethod(lambda ids: _set_visible(resource, ids)),
    }
    return type(f"Accelreg{resource.title().replace('_', '')}AcceleratorManager", (AcceleratorManager,), body)


def _managers() -> dict[str, type]:
    with _lock:
        managers = _state.get("managers")
        if managers is None:
            managers = _state["managers"] = {r: _make_manager(r) for r in _groups()}
        return managers


def _takes_over(resource: str, theirs: Any) -> bool:
    """Whether accelreg's manager replaces Ray's own for a resource name Ray has: only where
    Ray's own finds no device on this node and the backend's runtime package is installed
    (decided once per process)."""
    with _lock:
        decided = _state.setdefault("takes_over", {})
        if resource not in decided:
            try:
                ray_has = int(theirs.get_current_node_num_accelerators()) > 0
            except Exception:  # noqa: BLE001 - Ray's detection failing is Ray's answer: none
                ray_has = False
            decided[resource] = not ray_has and _installed(_spec(resource))
        return decided[resource]


def manager_for(resource: str) -> str | None:
    """The registry backend whose devices this process offers to Ray as ``resource`` (accelreg's
    manager is in charge of it here), or ``None`` (Ray's own manager, or no such resource).
    Needs the integration enabled; probes nothing."""
    if not ENABLED[0] or resource not in _groups():
        return None
    from ray._private import accelerators

    manager = accelerators.get_accelerator_manager_for_resource(resource)
    if manager is not _managers().get(resource):
        return None
    return _pick(resource)


def resources() -> dict[str, tuple[str, ...]]:
    """Ray resource name -> the registry backends offered under it (registry order), for every
    backend that has a visible-devices variable. Probes nothing."""
    return dict(_groups())


# -- the seams -----------------------------------------------------------------------------
def _get_all_accelerator_managers(original: Any) -> Any:
    @functools.wraps(original)
    def get_all_accelerator_managers() -> Any:
        managers = set(original())
        managers.update(_managers().values())
        return managers

    return get_all_accelerator_managers


def _get_accelerator_manager_for_resource(original: Any) -> Any:
    @functools.wraps(original)
    def get_accelerator_manager_for_resource(resource_name: str) -> Any:
        ours = _managers().get(resource_name)
        theirs = original(resource_name)
        if ours is None:
            return theirs
        if theirs is None or _takes_over(resource_name, theirs):
            return ours
        return theirs

    return get_accelerator_manager_for_resource


def _lists_managers(original: Any) -> bool:
    """Behaviour check: Ray's list is a collection of manager classes that name a resource."""
    managers = original()
    return bool(managers) and all(callable(getattr(m, "get_resource_name", None)) for m in managers)
