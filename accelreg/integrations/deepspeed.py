"""DeepSpeed: its accelerator is the registry's choice, and quantized checkpoints load onto the
right device.

**Accelerator.** DeepSpeed picks an accelerator with its own detection ladder, and refuses a
backend it does not list (``DS_ACCELERATOR must be one of [...]``). With this integration the
registry picks instead: at the moment DeepSpeed's accelerator module is imported
(:func:`prepare`, which ``accelreg.install()`` calls), or at ``enable()``, accelreg hands
DeepSpeed an accelerator for the registry's current backend through DeepSpeed's public
``set_accelerator``. It is DeepSpeed's own class for that device type where DeepSpeed ships one
(its op builders, graphs and vendor quirks live there), and accelreg's registry accelerator
(:mod:`accelreg.integrations.ds_accelerator`) for every other backend. A ``DS_ACCELERATOR`` the
user set is an explicit DeepSpeed choice and is left alone; :func:`accelerator_report` and
``accelreg env`` show any disagreement. ``disable()`` gives DeepSpeed back what it had.

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

from .. import placement, registry
from . import _postimport
from ._seams import LIBRARIES, Integration, Seam
from .ds_accelerator import accelerator_for, deepspeed_ships_class, registry_accelerator

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
def _hand_over(real: Any) -> None:
    """Give DeepSpeed the accelerator of the registry's current backend (idempotent)."""

    _state.pop("error", None)
    if os.environ.get("DS_ACCELERATOR"):
        return  # the user's explicit DeepSpeed choice wins; the report shows any mismatch
    backend = registry.get().current()
    current = real.ds_accelerator
    if current is not None and current is _state.get("handed") and _state.get("backend") == backend.name:
        return
    accelerator = accelerator_for(backend.name)
    ours_before = _state.get("handed")
    if ours_before is None:
        _state["previous"] = current
    real.set_accelerator(accelerator)
    _state.update(handed=accelerator, backend=backend.name)
    if current is not None and current is not ours_before and "deepspeed.runtime" in sys.modules:
        log.info(
            "accelreg: handed DeepSpeed the %s accelerator after DeepSpeed had picked %s; a few DeepSpeed "
            "modules keep what they saw at import (call accelreg.install() before importing deepspeed)",
            backend.name,
            getattr(current, "_name", current),
        )


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
    Runs inside the user's ``import deepspeed``, so a failure is a warning here (``enable()``,
    at the end of that import, reports it again)."""
    try:
        _hand_over(module)
    except Exception as exc:  # noqa: BLE001 - never break the user's import from here
        _state["error"] = f"{type(exc).__name__}: {exc}"
        log.warning("accelreg: could not hand DeepSpeed the registry's accelerator: %s", exc)


def prepare() -> None:
    """Hand DeepSpeed the registry's accelerator the moment DeepSpeed's accelerator module is
    imported, before DeepSpeed first picks one (cheap: imports nothing). ``install()`` calls it."""

    _postimport.when_imported(_REAL, _early)


def unprepare() -> None:
    """Forget a pending :func:`prepare` (``accelreg.integrations.uninstall()`` calls it)."""

    _postimport.cancel(_REAL)


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

    backend = registry.get().current()
    env = os.environ.get("DS_ACCELERATOR") or None
    real = sys.modules.get(_REAL)
    current = getattr(real, "ds_accelerator", None) if real is not None else None
    collectives = backend.spec.dist_backend
    unknown = "undeclared by the backend's plugin"
    if current is not None:
        name = str(getattr(current, "_name", type(current).__name__))
        implementation = _describe(current)
        try:
            collectives = current.communication_backend_name()
        except Exception:  # noqa: BLE001 - a report line must not raise
            collectives = None
        if current is _state.get("handed"):
            how = f"handed over by accelreg (the registry chose {_state['backend']})"
        elif env:
            how = f"chosen by DeepSpeed from DS_ACCELERATOR={env} (set by the user; accelreg leaves it)"
        else:
            how = "chosen by DeepSpeed itself (accelreg's DeepSpeed integration has not handed it over)"
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
        if INTEGRATION.enabled or _postimport.pending(_REAL):
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
    supported=">=0.17,<0.20",
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
