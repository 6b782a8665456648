"""Integrations: transformers, accelerate, peft and DeepSpeed ask the registry.

Each integration module has ``enable()``, ``disable()`` (restores exactly what was there),
``enabled()`` (a context manager) and ``INTEGRATION`` (its seams, version range and status).
:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from . import _postimport

__all__ = ["INTEGRATIONS", "install", "status", "uninstall"]

#: Integration name -> (its module, the library module whose import enables it).
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


def _module(name: str) -> Any:
    return importlib.import_module(INTEGRATIONS[name][0])


def _library_installed(trigger: str) -> bool:
    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def install() -> list[str]:
    """Enable every integration whose library is installed; returns their names.

    An integration is enabled when its library module is first imported (or now, if it
    already is). On a library version accelreg has not been tested with, that import raises
    :class:`~accelreg.errors.IntegrationError` rather than running half-patched; when that
    happens inside ``install()`` (the library was already imported), the integrations this
    call enabled are disabled again before the error propagates.
    """
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
            _postimport.when_imported(trigger, lambda _module_obj, n=name: _module(n).enable())
    except BaseException:
        # an already-imported library failed to enable: undo what this call did, so that a
        # failed install() leaves no integration half-installed
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
    tested range (``supported``) and whether the version is in it (``in_range``), ``enabled``,
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
    if item["enabled"]:
        return "enabled in this process"
    untested = (
        f"IntegrationError ({item['library']} {version} is outside the tested range {item.get('supported')})"
    )
    if item["pending"]:
        if item.get("in_range") is False:
            return f"install() was called: importing {trigger} will raise {untested}"
        return f"install() was called: enabled when {trigger} is imported"
    if item.get("in_range") is False:
        return f"install() would raise {untested}"
    return f"install() would enable it (when {trigger} is imported)"
