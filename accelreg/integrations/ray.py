"""Ray Core: the registry's backends are Ray resources, and each task or actor sees its own.

Ray decides which accelerators a node has from a fixed list of *accelerator managers* in its
own code (``ray._private.accelerators``): one class per device family, answering the resource
name, the device count on the node, and the visible-devices variable to set for a task. A
backend Ray does not list is invisible to it. With this integration every backend of the
registry that has a visible-devices variable gets a manager built from the registry:

- **resource name**: :attr:`BackendSpec.ray_resource_name <accelreg.types.BackendSpec.ray_resource_name>`
  — Ray's own name where the built-in plugin declares one (``NPU``, ``HPU``, ``GPU``), else the
  backend name upper-cased (``MLU``, ``MUSA``, ``SDAA``, a vendor's ``GCU``);
- **count** (asked when a node starts): the registry's device count, which respects the
  backend's mask; a backend that is present but failing gives a warning naming the backend
  and the reason, and 0 units;
- **per task**: a task or actor given ``k`` units gets the backend's visible-devices variable
  set to its ``k`` ids, and ``ACCELREG_DEVICE_ID=<backend>=<first id>``, so inside it
  ``accelreg.device_count() == k`` and ``accelreg.resolve()`` is device 0 of them (also in a
  Ray Train worker, whose ``LOCAL_RANK`` counts workers, not its devices). A worker process is
  reused across tasks: the registry re-reads the environment whenever Ray sets or restores a
  mask (:func:`accelreg.registry.refresh`), for Ray's own managers too.

Ray's own managers are left alone where accelreg adds nothing: for a resource name Ray
already has (``GPU``, ``NPU``, ``HPU``), accelreg's manager is used only when Ray's own finds
no device on the node and the backend's runtime package is installed (an Ascend node Ray
detects through ``/dev/davinci*`` keeps Ray's NPU manager; CUDA GPUs are always Ray's).

Seams (all in ``ray._private``; Ray has no public extension point for accelerators — its issue
#40880 "Support external accelerator plugin" is open): ``accelerators.get_all_accelerator_managers``
and ``accelerators.get_accelerator_manager_for_resource`` (the list and the lookup),
``utils.set_visible_accelerator_ids`` and ``utils.reset_visible_accelerator_env_vars`` (a task's
mask, set and restored), ``services.start_raylet`` (the raylet's environment gets
``ACCELREG_AUTO_INSTALL=1``, so every worker it starts installs accelreg's integrations too —
the case of ``accelreg.install(); ray.init()`` without ``accelreg run`` — and the node's failing
backends are reported). Ray Train's seams are the ``ray_train`` integration
(:mod:`accelreg.integrations.ray_train`): they import torch, which a process that only runs
Ray tasks must not pay for.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from .. import flags, registry
from ..registry import DEVICE_ID_VAR
from ..registry.probing import package_installed
from ..types import BackendSpec
from .seams import Adapter, Integration, Seam

__all__ = [
    "INTEGRATION",
    "disable",
    "enable",
    "enabled",
    "manager_for",
    "resources",
]

log = logging.getLogger("accelreg.integrations.ray")

#: The opt-in variable of :mod:`accelreg.launch.startup` (a layer above this one): set in the
#: environment of the raylets this process starts, so their workers install accelreg too.
AUTO_INSTALL_VAR = "ACCELREG_AUTO_INSTALL"

_ACCELERATORS = "ray._private.accelerators"
_UTILS = "ray._private.utils"
_SERVICES = "ray._private.services"

_lock = threading.RLock()
#: Per process, dropped by disable(): ``records`` (resource -> backend names, and backend ->
#: spec), ``managers`` (resource -> manager class), ``vars`` (visible-devices variable -> backend),
#: ``takes_over`` (resource -> whether accelreg's manager replaces Ray's), ``chosen`` (resource ->
#: backend picked), ``warned`` (backends whose failure was reported).
_state: dict[str, Any] = {}


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
    if not INTEGRATION.enabled or resource not in _groups():
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


#: Ray's setting (read from the environment by the raylet) that lists the resources whose units
#: are device instances, each handed to one task at a time with its own id. Ray lists its own
#: accelerators there (``GPU`` is built in); a resource missing from it gets id 0 for every task,
#: so two tasks given one unit each would share one device.
UNIT_INSTANCE_VAR = "RAY_custom_unit_instance_resources"
_BUILT_IN_UNITS = ("CPU", "GPU", "memory", "object_store_memory")


def _unit_instance_resources(env: Mapping[str, str]) -> str | None:
    """The value of :data:`UNIT_INSTANCE_VAR` for a raylet: the one the user set (or Ray's own
    accelerator names) plus every resource accelreg offers; ``None`` when nothing is added."""
    from ray._private import accelerators

    given = env.get(UNIT_INSTANCE_VAR, os.environ.get(UNIT_INSTANCE_VAR))
    if given is not None:
        names = [n.strip() for n in given.split(",") if n.strip()]
    else:  # Ray's default: the resource of each of its accelerator managers but the GPU
        names = sorted(m.get_resource_name() for m in accelerators.get_all_accelerator_managers())
    missing = [r for r in _groups() if r not in names]
    if given is not None and not missing:
        return None
    return ",".join(n for n in dict.fromkeys([*names, *missing]) if n not in _BUILT_IN_UNITS)


def _start_raylet(original: Any) -> Any:
    @functools.wraps(original)
    def start_raylet(*args: Any, **kwargs: Any) -> Any:
        env = dict(kwargs.get("env_updates") or {})
        if AUTO_INSTALL_VAR not in os.environ and AUTO_INSTALL_VAR not in env:
            env[AUTO_INSTALL_VAR] = "1"  # the raylet's workers install accelreg's integrations too
        try:
            units = _unit_instance_resources(env)
        except Exception as exc:  # noqa: BLE001 - a node must start; say what is lost
            units = None
            log.warning("accelreg: %s not set (%s): tasks may share a device", UNIT_INSTANCE_VAR, exc)
        if units is not None:
            env[UNIT_INSTANCE_VAR] = units  # one device per unit, with its own id
        kwargs["env_updates"] = env
        try:
            for resource in _groups():
                _report_failing(resource)
        except Exception as exc:  # noqa: BLE001 - a report must not stop a node from starting
            log.warning("accelreg: could not check this node's backends: %s", exc)
        return original(*args, **kwargs)

    return start_raylet


def _lists_managers(original: Any) -> bool:
    """Behaviour check: Ray's list is a collection of manager classes that name a resource."""
    managers = original()
    return bool(managers) and all(callable(getattr(m, "get_resource_name", None)) for m in managers)


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
RELEASES = ">=2.50,<2.61"
TESTED = {"oldest": "2.50.1", "middle": "2.55.1", "newest": "2.60.0"}

INTEGRATION = Integration(
    name="ray",
    distribution="ray",
    trigger="ray",
    releases=RELEASES,
    tested=TESTED,
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
