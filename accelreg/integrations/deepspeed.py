"""DeepSpeed: its accelerator is the registry's choice, and quantized checkpoints load onto the
right device.

**Accelerator.** DeepSpeed picks an accelerator with its own detection ladder, and refuses a
backend it does not list (``DS_ACCELERATOR must be one of [...]``). With this integration the
registry picks instead: at the moment DeepSpeed's accelerator module is imported
(:func:`prepare`, which ``accelreg.install()`` calls), or at ``enable()``, accelreg hands
DeepSpeed an accelerator for the registry's current backend through DeepSpeed's public
``set_accelerator``. It is DeepSpeed's own class for that device type where DeepSpeed ships one
(its op builders, graphs and vendor quirks live there), and accelreg's registry accelerator
(:mod:`accelreg.integrations.ds_accelerator`) for every other backend. The backend is chosen
under the rule of ``docs/reliability.md`` (:func:`accelreg.resolution.current_in_use`): in a
process a launcher started (``accelreg run`` included), a present but failing backend is a
:class:`~accelreg.errors.DeviceError`, and DeepSpeed gets a stand-in that raises it at its
first use of its accelerator — the job stops instead of training on DeepSpeed's cpu
accelerator. A ``DS_ACCELERATOR`` naming one of DeepSpeed's own accelerators is an explicit
DeepSpeed choice and is left alone; one naming a registry backend DeepSpeed does not know
(``DS_ACCELERATOR=emu``) gets that backend's accelerator. :func:`accelerator_report` and
``accelreg env`` show any disagreement. ``disable()`` gives DeepSpeed back what it had.

**Launchers.** DeepSpeed's launcher (``deepspeed``: the runner, then
``deepspeed.launcher.launch`` on each node) asks its accelerator how many devices a node has,
which variable masks them, and which variables to export to the other nodes. Under
``accelreg run`` those processes have the registry's accelerator too (the start-up hook), so
they start one rank per device of the registry's backend and mask each node with that
backend's variable; every accelerator accelreg hands over also exports ``ACCELREG_*`` to
nodes started over pdsh/ssh/MPI, so the processes there are registry-aware as well.

**Placement.** Seam: ``deepspeed.initialize`` (public; accelerate looks it up on the module at
call time, so Trainer's path goes through it too). Before the engine is built, the placement
rules are attached to the model (:func:`accelreg.placement.attach`), so
``engine.load_checkpoint`` — which always loads onto the CPU and offers no ``map_location`` —
hands each quantized layer its state on the device of the live weight (seed 000).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import Any

from .. import importwatch, placement, registry
from ..errors import DeviceError
from ..registry import Backend, Snapshot
from ..resolution import current_in_use
from .ds_accelerator import (
    EXPORTED,
    accelerator_for,
    deepspeed_ships_class,
    keep_inherited_masks,
    registry_accelerator,
)
from .seams import LIBRARIES, Integration, Seam

__all__ = [
    "INTEGRATION",
    "accelerator_for",
    "accelerator_report",
    "disable",
    "enable",
    "enabled",
    "prepare",
    "registry_accelerator",
    "unprepare",
]

log = logging.getLogger("accelreg.integrations.deepspeed")

_REAL = "deepspeed.accelerator.real_accelerator"

_attached = {"models": 0, "modules": 0}
#: What accelreg handed DeepSpeed: ``handed`` (the object), ``backend`` (its registry backend),
#: ``previous`` (DeepSpeed's accelerator before, possibly None); ``error`` of the last attempt.
_state: dict[str, Any] = {}


# -- the seam -----------------------------------------------------------------------------
def _initialize(original: Any) -> Any:
    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:

        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if model is not None and hasattr(model, "named_modules"):
            counts = placement.attach(model)
            if counts:
                _attached["models"] += 1
                _attached["modules"] += sum(counts.values())
        return original(*args, **kwargs)

    return initialize


# -- handing DeepSpeed the registry's accelerator ------------------------------------------
class _Refused:
    """DeepSpeed's accelerator when accelreg refused to choose one (a present but failing
    backend in a process a launcher started): any use of it raises that :class:`DeviceError`,
    so the job stops where DeepSpeed first needs a device instead of falling back to its cpu
    accelerator. (``import deepspeed`` itself may be that place: some DeepSpeed modules ask at
    import.)"""

    def __init__(self, reason: str) -> None:
        self.__dict__["_reason"] = reason

    def __getattr__(self, name: str) -> Any:
        reason = self.__dict__["_reason"]
        raise DeviceError(f"DeepSpeed needs its accelerator ({name}), but accelreg hands it none: {reason}")

    def __repr__(self) -> str:
        return f"<no DeepSpeed accelerator: accelreg refused ({self.__dict__['_reason']})>"


def _requested(snap: Snapshot, value: str) -> Backend | None:
    """The registry backend ``DS_ACCELERATOR=value`` names when DeepSpeed has no accelerator of
    that name (``None``: DeepSpeed's own choice, or a name the registry does not know either)."""
    if deepspeed_ships_class(value):
        return None
    return snap.by_name.get(value) or next((b for b in snap.order if b.device_type == value), None)


def _hand_over(real: Any) -> None:
    """Give DeepSpeed the accelerator of the registry's current backend (idempotent), chosen
    under the launcher rule; when that rule refuses (or strict mode does), DeepSpeed gets a
    :class:`_Refused` stand-in and the :class:`DeviceError` is raised."""

    _state.pop("error", None)
    snap = registry.get()
    try:
        env = os.environ.get("DS_ACCELERATOR")
        if env:
            backend = _requested(snap, env)
            if backend is None:
                return  # the user's explicit DeepSpeed choice wins; the report shows any mismatch
            why = f"DS_ACCELERATOR={env}: a registry backend DeepSpeed does not know"
        else:
            backend = current_in_use(snap)
            why = f"the registry chose {backend.name}"
        current = real.ds_accelerator
        if current is not None and current is _state.get("handed") and _state.get("backend") == backend.name:
            return
        accelerator = accelerator_for(backend.name)
    except DeviceError as exc:
        if snap.launcher is not None or snap.settings.strict:
            _install(real, _Refused(str(exc)), None, "refused")
        raise
    _export_accelreg(accelerator)
    keep_inherited_masks(accelerator, backend.name)
    current = real.ds_accelerator
    ours_before = _state.get("handed")
    _install(real, accelerator, backend.name, why)
    if current is not None and current is not ours_before and "deepspeed.runtime" in sys.modules:
        log.info(
            "accelreg: handed DeepSpeed the %s accelerator after DeepSpeed had picked %s; a few DeepSpeed "
            "modules keep what they saw at import (call accelreg.install() before importing deepspeed)",
            backend.name,
            getattr(current, "_name", current),
        )


def _install(real: Any, accelerator: Any, backend: str | None, why: str) -> None:
    if "handed" not in _state:
        _state["previous"] = real.ds_accelerator
    if isinstance(accelerator, _Refused):
        real.ds_accelerator = accelerator  # set_accelerator accepts only a DeepSpeedAccelerator
    else:
        real.set_accelerator(accelerator)
    _state.update(handed=accelerator, backend=backend, why=why)


def _export_accelreg(accelerator: Any) -> None:
    """Make ``accelerator.export_envs()`` include accelreg's variables (:data:`EXPORTED`):
    DeepSpeed's runner exports the variables with those prefixes to the nodes it starts over
    pdsh, ssh or MPI, so the processes there are registry-aware too. (Set on the instance
    accelreg built; DeepSpeed's class is left as it is.)"""
    original = accelerator.export_envs
    missing = [name for name in EXPORTED if name not in original()]
    if not missing:
        return

    def export_envs() -> list[str]:
        return [*original(), *missing]

    accelerator.export_envs = export_envs


def _take_back() -> None:
    if "handed" not in _state:
        return
    real = sys.modules.get(_REAL)
    if real is not None and real.ds_accelerator is _state["handed"]:
        real.ds_accelerator = _state["previous"]  # set_accelerator refuses None
    _state.clear()


def _on_enable() -> None:
    _hand_over(importlib.import_module(_REAL))


def _early(module: Any) -> None:
    """Before DeepSpeed's first ``get_accelerator()``: hand it the registry's accelerator.
    Runs inside the user's ``import deepspeed``, so nothing is raised from here (``enable()``,
    at the end of that import, reports a failure again); a refusal under a launcher raises
    from DeepSpeed's first use of its accelerator instead (:class:`_Refused`)."""
    try:
        _hand_over(module)
    except Exception as exc:  # noqa: BLE001 - never break the user's import from here
        _state["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(_state.get("handed"), _Refused):
            log.error("accelreg: DeepSpeed gets no accelerator, its first use of one raises: %s", exc)
        else:
            log.warning("accelreg: could not hand DeepSpeed the registry's accelerator: %s", exc)


def prepare() -> None:
    """Hand DeepSpeed the registry's accelerator the moment DeepSpeed's accelerator module is
    imported, before DeepSpeed first picks one (cheap: imports nothing). ``install()`` calls it."""

    importwatch.when_imported(_REAL, _early)


def unprepare() -> None:
    """Forget a pending :func:`prepare` and give DeepSpeed back what it had, also after a
    hand-over that refused (``accelreg.integrations.uninstall()`` calls it)."""

    importwatch.cancel(_REAL)
    _take_back()


# -- the report ----------------------------------------------------------------------------
def _describe(accelerator: Any) -> str:
    if type(accelerator).__name__ == "RegistryAccelerator":
        return "accelreg's registry accelerator"
    return f"DeepSpeed's {type(accelerator).__name__}"


def accelerator_report() -> dict[str, Any]:
    """DeepSpeed's accelerator next to accelreg's current backend (never imports DeepSpeed).

    Keys: ``deepspeed`` (the device type DeepSpeed uses, or will use), ``implementation``
    (DeepSpeed's own class, or accelreg's registry accelerator), ``collectives`` (its
    ``torch.distributed`` backend, when known), ``how`` (handed over by accelreg, or chosen by
    DeepSpeed, and why), ``accelreg`` and ``accelreg_device_type`` (the current backend),
    ``agree``, ``DS_ACCELERATOR``, ``error`` (a failed hand-over) and ``summary`` (one line).
    """

    snap = registry.get()
    backend = snap.current()
    env = os.environ.get("DS_ACCELERATOR") or None
    real = sys.modules.get(_REAL)
    current = getattr(real, "ds_accelerator", None) if real is not None else None
    collectives = backend.spec.dist_backend
    unknown = "undeclared by the backend's plugin"
    requested = _requested(snap, env) if env else None
    if isinstance(current, _Refused):
        name, implementation, collectives = "none", "no accelerator", None
        reason = current.__dict__["_reason"]
        how = f"refused by accelreg, DeepSpeed's first use of its accelerator raises: {reason}"
    elif current is not None:
        name = str(getattr(current, "_name", type(current).__name__))
        implementation = _describe(current)
        try:
            collectives = current.communication_backend_name()
        except Exception:  # noqa: BLE001 - a report line must not raise
            collectives = None
        if current is _state.get("handed"):
            how = f"handed over by accelreg ({_state['why']})"
        elif requested is not None:
            how = (
                f"chosen by DeepSpeed itself; DS_ACCELERATOR={env} names a registry backend DeepSpeed does "
                "not know: accelreg hands it over once enabled"
            )
        elif env:
            how = f"chosen by DeepSpeed from DS_ACCELERATOR={env} (set by the user; accelreg leaves it)"
        else:
            how = "chosen by DeepSpeed itself (accelreg's DeepSpeed integration has not handed it over)"
    elif requested is not None:
        name, implementation = requested.device_type, "accelreg's registry accelerator"
        collectives = requested.spec.dist_backend
        how = f"DS_ACCELERATOR={env} names a registry backend DeepSpeed does not know: accelreg hands it over"
    elif env:
        name, implementation = env, "DeepSpeed's own"
        collectives, unknown = None, "not known before DeepSpeed picks"
        how = f"DS_ACCELERATOR={env} set by the user: DeepSpeed will use its own class; accelreg leaves it"
    else:
        name = backend.device_type
        implementation = (
            f"DeepSpeed's own {name} class"
            if deepspeed_ships_class(name)
            else f"accelreg's registry accelerator: DeepSpeed has no {name} class"
        )
        if INTEGRATION.enabled or importwatch.pending(_REAL):
            how = "DeepSpeed has not picked yet; accelreg hands it over when DeepSpeed does"
        else:
            how = "DeepSpeed not imported yet; accelreg.install() or enable() hands it over"
    agree = name in (backend.name, backend.device_type) and (
        current is None or current is not _state.get("handed") or _state.get("backend") == backend.name
    )
    verdict = "agrees with" if agree else "DISAGREES with"
    summary = (
        f"DeepSpeed accelerator {name} ({implementation}; collectives {collectives or unknown}) "
        f"{verdict} accelreg's {backend.name}: {how}"
    )
    if _state.get("error"):
        summary += f"; hand-over failed: {_state['error']}"
    return {
        "deepspeed": name,
        "implementation": implementation,
        "collectives": collectives,
        "how": how,
        "accelreg": backend.name,
        "accelreg_device_type": backend.device_type,
        "agree": agree,
        "DS_ACCELERATOR": env,
        "error": _state.get("error"),
        "summary": summary,
    }


# -- the integration ----------------------------------------------------------------------
def _status(integ: Integration, out: dict[str, Any]) -> None:
    """The placement rules attached, and whose accelerator DeepSpeed runs on (``accelreg env``)."""
    if integ.enabled and _attached["models"]:
        out["note"] += (
            f"; placement rules attached to {_attached['modules']} quantized modules "
            f"in {_attached['models']} model(s)"
        )
    if integ.version() is None:
        return
    try:
        report = accelerator_report()
    except Exception as exc:  # noqa: BLE001 - a status line must not raise
        out["note"] += f"; DeepSpeed accelerator: unknown ({type(exc).__name__}: {exc})"
        return
    out["accelerator"] = report  # accelreg env prints report["summary"] as its own line


INTEGRATION = Integration(
    name="deepspeed",
    distribution="deepspeed",
    trigger="deepspeed",
    releases=">=0.17,<0.20",
    tested={"oldest": "0.17.6", "middle": "0.18.9", "newest": "0.19.8"},
    seams=[
        Seam(
            "deepspeed",
            "initialize",
            _initialize,
            params=("args", "model", "optimizer"),
            why="attach the quantized-weight placement rules to the model before the engine is built",
        )
    ],
    scan_prefixes=LIBRARIES,
    on_enable=_on_enable,
    on_disable=_take_back,
    prepare=prepare,
    unprepare=unprepare,
    add_status=_status,
)


enable, disable, enabled = INTEGRATION.api()
