"""DeepSpeed: quantized checkpoints load onto the right device, and DeepSpeed's accelerator
agrees with the registry.

Seam: ``deepspeed.initialize`` (public; accelerate looks it up on the module at call time, so
Trainer's path goes through it too). Before the engine is built, the placement rules are
attached to the model (:func:`accelreg.placement.attach`), so ``engine.load_checkpoint`` —
which always loads onto the CPU and offers no ``map_location`` — hands each quantized layer
its state on the device of the live weight. The hooks live on the model, so Trainer's
``_load_best_model`` (seed 000) needs nothing beyond ``accelreg.install()``.

DeepSpeed picks its accelerator itself: ``DS_ACCELERATOR``, else its own detection ladder
(``deepspeed/accelerator/real_accelerator.py``, 0.19.8: xpu, npu, sdaa, mps, hpu, mlu, supa,
klxpu, cuda, else cpu). :func:`accelerator_report` compares it with accelreg's current backend
without importing DeepSpeed; ``enable()`` switches DeepSpeed to the registry's backend when the
user chose a backend through accelreg (``priority`` or ``disable`` configured) and did not set
``DS_ACCELERATOR``. :func:`prepare` does the same before DeepSpeed first picks (a few DeepSpeed
modules keep the accelerator they saw at import).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._seams import LIBRARIES, Integration, Seam

__all__ = ["INTEGRATION", "accelerator_report", "disable", "enable", "enabled", "prepare", "unprepare"]

log = logging.getLogger("accelreg.integrations.deepspeed")

_REAL = "deepspeed.accelerator.real_accelerator"
#: DeepSpeed 0.19.8's accelerators (real_accelerator.py:23).
DS_ACCELERATORS = ("cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu")

_attached = {"models": 0, "modules": 0}
_saved_accelerator: list[Any] = []  # [previous ds_accelerator, previous DS_ACCELERATOR] while aligned
_last_align: dict[str, str] = {}


# -- the seam -----------------------------------------------------------------------------
def _initialize(original: Any) -> Any:
    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        from .. import placement

        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if model is not None and hasattr(model, "named_modules"):
            counts = placement.attach(model)
            if counts:
                _attached["models"] += 1
                _attached["modules"] += sum(counts.values())
        return original(*args, **kwargs)

    return initialize


# -- accelerator agreement ----------------------------------------------------------------
def _predict() -> str:
    """What DeepSpeed 0.19.8's auto-detection would pick here (real_accelerator.py:128-209),
    checked with ``find_spec`` and torch only: nothing is imported that DeepSpeed would import."""
    import torch

    def has(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    for package, name in (("torch_npu", "npu"), ("torch_sdaa", "sdaa")):
        if has(package):
            return name
    if torch.backends.mps.is_available():
        return "mps"
    for package, name in (("habana_frameworks", "hpu"), ("torch_mlu", "mlu"), ("torch_supa", "supa")):
        if has(package):
            return name
    if has("torch_xmlir"):
        return "klxpu"
    if torch.cuda.device_count() > 0 and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _deepspeed_choice() -> tuple[str, str]:
    """DeepSpeed's accelerator and how it was chosen, without importing DeepSpeed."""
    real = sys.modules.get(_REAL)
    current = getattr(real, "ds_accelerator", None) if real is not None else None
    if current is not None:
        how = "aligned by accelreg" if _saved_accelerator else "chosen by DeepSpeed"
        if not _saved_accelerator and os.environ.get("DS_ACCELERATOR"):
            how = "chosen by DeepSpeed from DS_ACCELERATOR"
        return str(current._name), how
    env = os.environ.get("DS_ACCELERATOR")
    if env:
        return env, "from DS_ACCELERATOR; DeepSpeed not imported yet"
    return _predict(), "predicted from DeepSpeed's auto-detection; DeepSpeed not imported yet"


def accelerator_report() -> dict[str, Any]:
    """DeepSpeed's accelerator next to accelreg's current backend (never imports DeepSpeed).

    Keys: ``deepspeed`` (its accelerator name), ``how`` (chosen by DeepSpeed, from
    ``DS_ACCELERATOR``, predicted, or aligned by accelreg), ``accelreg`` (current backend),
    ``agree``, ``DS_ACCELERATOR``, ``priority_source`` (where accelreg's priority came from;
    ``"default"`` when unset), ``chosen_by`` (the settings by which the user chose a backend
    through accelreg: ``priority``/``disable`` and their sources; empty when none),
    ``action`` and ``summary`` (one line).
    """
    import accelreg

    from .. import registry

    ds_name, how = _deepspeed_choice()
    backend = accelreg.current_backend()
    sources = registry.get().settings.sources
    source = sources.get("priority", "default")
    chosen = [
        f"{key} from {sources[key]}"
        for key in ("priority", "disable")
        if sources.get(key, "default") != "default"
    ]
    agree = ds_name in (backend.name, backend.device_type)
    env = os.environ.get("DS_ACCELERATOR")
    user_env = env if env and not _saved_accelerator else None
    if agree:
        action = "none needed"
    elif user_env:
        action = f"left as is: DS_ACCELERATOR={user_env} was set by the user"
    elif not chosen:
        action = (
            "left as is: no backend was chosen through accelreg; set accelreg's priority or "
            "disable (or DS_ACCELERATOR) to choose"
        )
    elif backend.name not in DS_ACCELERATORS:
        action = f"cannot align: DeepSpeed has no {backend.name!r} accelerator ({', '.join(DS_ACCELERATORS)})"
    elif sys.modules.get(_REAL) is None:
        action = f"enable() will switch DeepSpeed to {backend.name!r} ({'; '.join(chosen)})"
    else:
        action = f"enable() switches DeepSpeed to {backend.name!r} ({'; '.join(chosen)})"
    if _last_align.get("error"):
        action = f"alignment failed: {_last_align['error']}"
    verdict = "agrees with" if agree else "DISAGREES with"
    summary = f"DeepSpeed accelerator {ds_name} ({how}) {verdict} accelreg's {backend.name}"
    if not agree:
        summary += f"; {action}"
    return {
        "deepspeed": ds_name,
        "how": how,
        "accelreg": backend.name,
        "accelreg_device_type": backend.device_type,
        "agree": agree,
        "DS_ACCELERATOR": env,
        "priority_source": source,
        "chosen_by": chosen,
        "action": action,
        "summary": summary,
    }


def _wanted() -> str | None:
    """The accelerator DeepSpeed should switch to, or None to leave it alone."""
    report = accelerator_report()
    if report["agree"] or not report["chosen_by"] or _saved_accelerator:
        return None
    if report["DS_ACCELERATOR"]:
        return None  # the user's explicit DeepSpeed choice wins; accelreg env shows the mismatch
    return report["accelreg"] if report["accelreg"] in DS_ACCELERATORS else None


def _align() -> None:
    """Make DeepSpeed's accelerator the registry's (see the module docstring for when)."""
    _last_align.clear()
    try:
        wanted = _wanted()
    except Exception as exc:  # noqa: BLE001 - the placement seam must not depend on this
        _last_align["error"] = f"{type(exc).__name__}: {exc}"
        log.warning("accelreg: cannot compare DeepSpeed's accelerator with the registry: %s", exc)
        return
    if wanted is None:
        return
    real = importlib.import_module(_REAL)
    previous, env = real.ds_accelerator, os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = wanted
    real.ds_accelerator = None
    try:
        real.get_accelerator()
    except Exception as exc:  # noqa: BLE001 - DeepSpeed refused (vendor package missing, ...)
        real.ds_accelerator = previous
        _restore_env(env)
        _last_align["error"] = f"DeepSpeed refused {wanted!r}: {exc}"
        log.warning("accelreg: could not switch DeepSpeed's accelerator to %r: %s", wanted, exc)
        return
    _saved_accelerator[:] = [previous, env]
    if previous is not None and "deepspeed.runtime.utils" in sys.modules:
        log.info(
            "accelreg: switched DeepSpeed's accelerator from %s to %s after DeepSpeed was imported; "
            "a few DeepSpeed modules keep the one they saw at import (call accelreg.install() "
            "before importing deepspeed)",
            previous._name,
            wanted,
        )


def _restore_env(value: str | None) -> None:
    if value is None:
        os.environ.pop("DS_ACCELERATOR", None)
    else:
        os.environ["DS_ACCELERATOR"] = value


def _unalign() -> None:
    if not _saved_accelerator:
        return
    real = importlib.import_module(_REAL)
    previous, env = _saved_accelerator
    real.ds_accelerator = previous
    _restore_env(env)
    _saved_accelerator.clear()


def _early(_module: Any) -> None:
    """Before DeepSpeed's first ``get_accelerator()``: name the registry's backend in
    ``DS_ACCELERATOR`` when the user chose one through accelreg (and not through DeepSpeed)."""
    try:
        wanted = _wanted()
    except Exception as exc:  # noqa: BLE001
        log.warning("accelreg: cannot compare DeepSpeed's accelerator with the registry: %s", exc)
        return
    real = sys.modules.get(_REAL)
    if wanted is None or real is None or real.ds_accelerator is not None:
        return
    # ``wanted`` is the registry's current backend, so its runtime is importable here: the
    # backend's own probe said so (no per-vendor package list in this module)
    _saved_accelerator[:] = [None, os.environ.get("DS_ACCELERATOR")]
    os.environ["DS_ACCELERATOR"] = wanted


def prepare() -> None:
    """Align DeepSpeed's accelerator at the moment DeepSpeed's accelerator module is imported,
    before DeepSpeed picks one (cheap: imports nothing). ``accelreg.install()`` calls it."""
    from . import _postimport

    _postimport.when_imported(_REAL, _early)


def unprepare() -> None:
    """Forget a pending :func:`prepare` (``accelreg.integrations.uninstall()`` calls it)."""
    from . import _postimport

    _postimport.cancel(_REAL)


# -- the integration ----------------------------------------------------------------------
class _DeepSpeedIntegration(Integration):
    def status(self) -> dict[str, Any]:
        out = super().status()
        if self.enabled and _attached["models"]:
            out["note"] += (
                f"; placement rules attached to {_attached['modules']} quantized modules "
                f"in {_attached['models']} model(s)"
            )
        if self.version() is None:
            return out
        try:
            report = accelerator_report()
        except Exception as exc:  # noqa: BLE001 - a status line must not raise
            out["note"] += f"; DeepSpeed accelerator: unknown ({type(exc).__name__}: {exc})"
            return out
        out["accelerator"] = report
        out["note"] += "; " + report["summary"]
        return out


INTEGRATION = _DeepSpeedIntegration(
    name="deepspeed",
    distribution="deepspeed",
    supported=">=0.19.8,<0.20",
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
    on_enable=_align,
    on_disable=_unalign,
)


def enable() -> None:
    """Enable the DeepSpeed integration (idempotent)."""
    INTEGRATION.enable()


def disable() -> None:
    """Restore DeepSpeed exactly as it was (also its accelerator, if accelreg switched it)."""
    INTEGRATION.disable()


@contextmanager
def enabled() -> Iterator[None]:
    """Enable for a block."""
    with INTEGRATION.enabled_for():
        yield
