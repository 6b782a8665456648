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
    :class:`~accelreg.errors.IntegrationError` rather than running half-patched.
    """
    chosen = []
    for name, (_, trigger) in INTEGRATIONS.items():
        if not _library_installed(trigger):
            continue
        chosen.append(name)
        _postimport.when_imported(trigger, lambda _module_obj, n=name: _module(n).enable())
    return chosen


def uninstall() -> None:
    """Disable every integration and forget pending ones."""
    for module, trigger in INTEGRATIONS.values():
        _postimport.cancel(trigger)
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.disable()


def status() -> list[dict[str, Any]]:
    """One entry per integration: library, installed version, tested range, enabled."""
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
        out.append(mod.INTEGRATION.status())
    return out
