"""Integrations: transformers, accelerate, peft and DeepSpeed ask the registry.

Each integration module has ``enable()``, ``disable()`` (restores exactly what was there),
``enabled()`` (a context manager) and ``INTEGRATION`` (its seams, their adapters and status).
:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them — and nothing it runs inside
that import can raise into the user's ``import`` statement.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import warnings
from typing import Any

from . import _postimport
from ._seams import IntegrationWarning

__all__ = ["INTEGRATIONS", "IntegrationWarning", "install", "raise_recorded", "status", "uninstall"]

log = logging.getLogger("accelreg.integrations")

#: name -> (integration module, the library module whose import enables it). The trigger is a
#: module that is imported only once its package is complete: firing on a submodule the package
#: ``__init__`` is still importing (``accelerate.utils.modeling``) would make ``enable()`` import
#: from a partially initialised package (a circular-import error inside the user's import).
#: transformers imports its submodules lazily, so ``modeling_utils`` is safe there.
INTEGRATIONS: dict[str, tuple[str, str]] = {
    "accelerate": ("accelreg.integrations.accelerate", "accelerate"),
    "transformers": ("accelreg.integrations.transformers", "transformers.modeling_utils"),
    "peft": ("accelreg.integrations.peft", "peft"),
    "deepspeed": ("accelreg.integrations.deepspeed", "deepspeed"),
}

_lock = threading.Lock()
#: Failures of an enable() run inside an import hook, in strict mode: raised by the next
#: accelreg integration call (:func:`raise_recorded`).
_recorded: list[tuple[str, BaseException]] = []


def _module(name: str) -> Any:
    return importlib.import_module(INTEGRATIONS[name][0])


def _library_installed(trigger: str) -> bool:
    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _strict() -> bool:
    from ._seams import _strict as strict

    return strict()


def _enable_in_hook(name: str) -> None:
    """Run by the import hook once ``name``'s library is imported: never raises."""
    try:
        _module(name).enable()
    except Exception as exc:  # noqa: BLE001 - a failure here must not reach the user's import
        try:
            strict = _strict()
        except Exception:  # noqa: BLE001 - a broken configuration is reported elsewhere
            strict = False
        if strict:
            with _lock:
                _recorded.append((name, exc))
        message = (
            f"accelreg: the {name} integration could not be enabled when its library was imported "
            f"({type(exc).__name__}: {exc}); {name} runs unpatched"
            + ("; strict mode: the next accelreg integration call raises this" if strict else "")
        )
        try:
            warnings.warn(IntegrationWarning(message), stacklevel=2)
        except Exception:  # noqa: BLE001 - warnings turned into errors must not break the import
            log.warning(message)


def raise_recorded() -> None:
    """Raise the first integration failure recorded inside an import hook in strict mode
    (with it as the cause), and forget them; nothing when there is none."""
    from ..errors import IntegrationError

    with _lock:
        failures = list(_recorded)
        _recorded.clear()
    if failures:
        name, exc = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise IntegrationError(
            f"strict mode: the {name} integration failed when its library was imported: "
            f"{type(exc).__name__}: {exc}{others}"
        ) from exc


def install() -> list[str]:
    """Enable every integration whose library is installed; returns their names.

    An integration is enabled when its library module is first imported (or now, if it
    already is); a seam that matches no adapter is skipped with an
    :class:`IntegrationWarning`, and nothing raised there reaches the user's ``import``. In
    strict mode (``ACCELREG_STRICT=1`` / ``configure(strict=True)``) every installed library is
    imported and enabled *now*, so a seam that matches no adapter raises
    :class:`~accelreg.errors.IntegrationError` from this call; the integrations it enabled
    are disabled again first, so a failed ``install()`` leaves nothing half-installed.
    """
    raise_recorded()
    strict = _strict()
    chosen = []
    before = {name for name in INTEGRATIONS if _module(name).INTEGRATION.enabled}
    try:
        for name, (_, trigger) in INTEGRATIONS.items():
            if not _library_installed(trigger):
                continue
            chosen.append(name)
            prepare = getattr(_module(name), "prepare", None)
            if prepare is not None:
                prepare()  # work that must happen before the library first runs (imports nothing)
            if strict:
                importlib.import_module(trigger)
                _module(name).enable()  # reads the strict setting: raises on a seam it cannot match
            else:
                _postimport.when_imported(trigger, lambda _module_obj, n=name: _enable_in_hook(n))
    except BaseException:
        for name in chosen:
            _postimport.cancel(INTEGRATIONS[name][1])
            if name not in before:
                _module(name).disable()
        raise
    return chosen


def uninstall() -> None:
    """Disable every integration and forget pending ones."""
    for module, trigger in INTEGRATIONS.values():
        _postimport.cancel(trigger)
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        unprepare = getattr(mod, "unprepare", None)
        if unprepare is not None:
            unprepare()
        mod.disable()


def status() -> list[dict[str, Any]]:
    """One entry per integration, for this process: ``name``, ``library``, installed ``version``,
    tested releases (``supported``) and whether the version is among them (``in_range``),
    ``seams`` (each seam's adapter, or none), ``skipped``, ``all_match``, ``enabled``,
    ``pending`` (install() is waiting for ``trigger`` to be imported), ``install`` (what
    install() did or would do, in words) and ``note``."""
    out = []
    for name, (module, trigger) in INTEGRATIONS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            out.append(
                {
                    "name": name,
                    "library": trigger.split(".")[0],
                    "version": None,
                    "enabled": False,
                    "note": str(exc),
                }
            )
            continue
        item = mod.INTEGRATION.status()
        item["trigger"] = trigger
        item["pending"] = _postimport.pending(trigger)
        item["install"] = _install_effect(item)
        out.append(item)
    return out


def _install_effect(item: dict[str, Any]) -> str:
    """What :func:`install` did, or would do, for one integration in this process."""
    trigger, version = item["trigger"], item.get("version")
    if version is None:
        return "library not installed: install() skips it"
    skipped = item.get("skipped") or []
    partly = f", skipping {len(skipped)} seam(s) that match no adapter (one warning each)" if skipped else ""
    if item["enabled"]:
        return "enabled in this process" + partly
    if item["pending"]:
        return f"install() was called: enabled when {trigger} is imported{partly}"
    return f"install() would enable it (when {trigger} is imported){partly}"
