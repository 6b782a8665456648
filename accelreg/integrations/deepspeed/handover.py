"""DeepSpeed's accelerator is the registry's choice: the hand-over, and its report.

At the moment DeepSpeed's accelerator module is imported (:func:`early`, armed by
``accelreg.install()`` through the table row's ``early`` hook), or at ``enable()``, accelreg
hands DeepSpeed an accelerator for the registry's current backend through DeepSpeed's public
``set_accelerator``; ``disable()`` gives DeepSpeed back what it had.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

from ... import importwatch, registry
from ...errors import DeviceError
from ...registry import Backend, Snapshot
from ...resolution import current_in_use
from .accelerator import (
    EXPORTED,
    accelerator_for,
    deepspeed_ships_class,
    keep_inherited_masks,
)

__all__ = ["accelerator_report", "early", "on_enable", "prepare", "take_back", "unprepare"]

log = logging.getLogger("accelreg.integrations.deepspeed")


_REAL = "deepspeed.accelerator.real_accelerator"


#: What accelreg handed DeepSpeed: ``handed`` (the object), ``backend`` (its registry backend),
#: ``previous`` (DeepSpeed's accelerator before, possibly None); ``error`` of the last attempt.
_state: dict[str, Any] = {}
#: Whether the integration is enabled (set by :func:`on_enable`, cleared by :func:`take_back`).
_enabled = [False]


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


def take_back() -> None:
    """``disable()``: give DeepSpeed back the accelerator it had before the hand-over."""
    _enabled[0] = False
    if "handed" not in _state:
        return
    real = sys.modules.get(_REAL)
    if real is not None and real.ds_accelerator is _state["handed"]:
        real.ds_accelerator = _state["previous"]  # set_accelerator refuses None
    _state.clear()


def on_enable() -> None:
    """``enable()``: hand DeepSpeed the registry's accelerator now (idempotent)."""
    _enabled[0] = True
    _hand_over(importlib.import_module(_REAL))


def early(module: Any) -> None:
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
    imported, before DeepSpeed first picks one (cheap: imports nothing). ``install()`` arms the
    same hook from the table row (its ``early``), without importing this module first."""

    importwatch.when_imported(_REAL, early)


def unprepare() -> None:
    """Forget a pending :func:`prepare` and give DeepSpeed back what it had, also after a
    hand-over that refused (``accelreg.integrations.uninstall()`` calls it)."""

    importwatch.cancel(_REAL)
    take_back()


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
        if _enabled[0] or importwatch.pending(_REAL):
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
