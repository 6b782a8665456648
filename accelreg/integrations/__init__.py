"""Integrations: the host libraries ask the registry.

Every integration has one shape (:class:`~._seams.Integration`): a module
``accelreg.integrations.<name>`` holding the library's seams, one ``INTEGRATION`` object, and
``enable, disable, enabled = INTEGRATION.api()``. Adding a host library is writing that module
and naming it in :data:`HOSTS`; nothing else changes.

:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them — and nothing it runs inside
that import can raise into the user's ``import`` statement.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from . import _postimport
from ._seams import Integration, IntegrationWarning, enable_in_hook, raise_recorded, strict_mode

__all__ = [
    "HOSTS",
    "INTEGRATIONS",
    "IntegrationWarning",
    "install",
    "integration",
    "raise_recorded",
    "status",
    "uninstall",
]

#: The host libraries, in the order ``install()`` enables them: the name of each integration
#: module (``accelreg.integrations.<name>``).
HOSTS: tuple[str, ...] = (
    "accelerate",
    "transformers",
    "peft",
    "deepspeed",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
)


def integration(name: str) -> Integration:
    """The :class:`~._seams.Integration` of host library ``name`` (its module imports nothing of
    the library itself)."""
    return importlib.import_module(f"{__name__}.{name}").INTEGRATION


#: name -> (integration module, the library module whose import enables it).
INTEGRATIONS: dict[str, tuple[str, str]] = {
    name: (f"{__name__}.{name}", integration(name).trigger) for name in HOSTS
}


def _library_installed(trigger: str) -> bool:
    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


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
    strict = strict_mode()
    chosen: list[Integration] = []
    before = {name for name in HOSTS if integration(name).enabled}
    try:
        for name in HOSTS:
            integ = integration(name)
            if not _library_installed(integ.trigger):
                continue
            chosen.append(integ)
            if integ.prepare is not None:
                integ.prepare()  # work that must happen before the library first runs (imports nothing)
            if strict:
                importlib.import_module(integ.trigger)
                integ.enable()  # reads the strict setting: raises on a seam it cannot match
            else:
                _postimport.when_imported(integ.trigger, lambda _module, i=integ: enable_in_hook(i))
    except BaseException:
        for integ in chosen:
            _postimport.cancel(integ.trigger)
            if integ.name not in before:
                integ.disable()
        raise
    return [integ.name for integ in chosen]


def uninstall() -> None:
    """Disable every integration and forget pending ones."""
    for name in HOSTS:
        integ = integration(name)
        _postimport.cancel(integ.trigger)
        if integ.unprepare is not None:
            integ.unprepare()
        integ.disable()


def status() -> list[dict[str, Any]]:
    """One entry per integration, for this process: ``name``, ``library``, installed ``version``,
    tested releases (``supported``) and whether the version is among them (``in_range``),
    ``seams`` (each seam's adapter, or none), ``skipped``, ``all_match``, ``enabled``,
    ``pending`` (install() is waiting for ``trigger`` to be imported), ``install`` (what
    install() did or would do, in words) and ``note``."""
    out = []
    for name in HOSTS:
        integ = integration(name)
        item = integ.status()
        item["trigger"] = integ.trigger
        item["pending"] = _postimport.pending(integ.trigger)
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
