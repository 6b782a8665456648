"""Integrations: the host libraries ask the registry.

Every integration has one shape (:class:`~.seams.Integration`): a module holding the library's
seams and one ``INTEGRATION`` object, a row of the integrations table (:mod:`.table`: the
built-ins in ``table.BUILTIN``, third parties through the ``accelreg.integrations`` entry-point
group). Adding a host library is writing that module and naming it in the table; nothing else
changes.

:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them — and nothing it runs inside
that import can raise into the user's ``import`` statement. Before anything is patched, the
installed releases are checked against the table: a release outside it is named (strict mode:
an :class:`~accelreg.errors.IntegrationError`).

This package's ``__init__`` is cheap on purpose (it imports only the import hooks and the
table's static part): a process under ``accelreg run`` imports it at start-up
(:mod:`accelreg.launch.startup`) and must not pay for the registry or any integration module
before a host library is imported. The rest is served by name (:func:`integration`, and
``IntegrationWarning`` from :mod:`.seams` on first use).
"""

from __future__ import annotations

import importlib

from .. import importwatch
from ..deferred import raise_recorded
from ..errors import IntegrationError
from . import table

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .seams import Integration, IntegrationWarning

__all__ = [
    "IntegrationWarning",
    "install",
    "integration",
    "raise_recorded",
    "status",
    "table",
    "uninstall",
]


def __getattr__(name: str) -> Any:
    if name == "IntegrationWarning":
        value = importlib.import_module(f"{__name__}.seams").IntegrationWarning
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def integration(name: str) -> Integration:
    """The :class:`~.seams.Integration` called ``name``, a row of :mod:`.table` (importing its
    module, which imports nothing of the library itself)."""
    return table.integration(name)


def _library_installed(trigger: str) -> bool:
    import importlib.util  # not at start-up: this package is imported in every job process

    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def install() -> list[str]:
    """Enable every integration whose library is installed; returns their names.

    First the conflict report: an installed release outside the integrations table (a release
    its adapters were not verified with) is named in one :class:`IntegrationWarning` per
    integration, before anything is patched; its seams are then matched by shape like any other. An
    integration is enabled when its library module is first imported (or now, if it
    already is); a seam that matches no adapter is skipped with an
    :class:`IntegrationWarning`, and nothing raised there reaches the user's ``import``. In
    strict mode (``ACCELREG_STRICT=1`` / ``configure(strict=True)``) every installed library is
    imported and enabled *now*, so a seam that matches no adapter raises
    :class:`~accelreg.errors.IntegrationError` from this call (so do a conflict and a
    third-party integration that failed to load, before anything is patched); the integrations it
    enabled are disabled again first, so a failed ``install()`` leaves nothing half-installed.
    """
    from .seams import enable_in_hook, strict_mode

    raise_recorded()
    strict = strict_mode()
    if strict and table.failures():
        failure = table.failures()[0]
        raise IntegrationError(
            f"strict mode: the integration {failure.entry_point!r} of {failure.distribution} could not be "
            f"loaded: {failure.reason}"
        )
    installed = [integ for integ in table.integrations() if _library_installed(integ.trigger)]
    for integ in installed:  # the conflict report: before anything is patched
        integ.report_conflicts(strict=strict)
    chosen: list[Integration] = []
    before = {integ.name for integ in installed if integ.enabled}
    try:
        for integ in installed:
            trigger = integ.trigger
            chosen.append(integ)
            if integ.prepare is not None:
                integ.prepare()  # work that must happen before the library first runs (imports nothing)
            if strict:
                importlib.import_module(trigger)
                integ.enable()  # reads the strict setting: raises on a seam it cannot match
            else:
                importwatch.when_imported(trigger, lambda _module, i=integ: enable_in_hook(i))
    except BaseException:
        for integ in chosen:
            importwatch.cancel(integ.trigger)
            if integ.name not in before:
                integ.disable()
        raise
    return [integ.name for integ in chosen]


def uninstall() -> None:
    """Disable every integration and forget pending ones."""
    for integ in table.integrations():
        importwatch.cancel(integ.trigger)
        if integ.unprepare is not None:
            integ.unprepare()
        integ.disable()


def status() -> list[dict[str, Any]]:
    """One entry per row of the integrations table, for this process: ``name``, ``library``,
    installed ``version``, the ``releases`` it serves and whether the version is among them
    (``in_range``), ``tested`` (the release matrix's releases), ``conflicts``, ``seams`` (each
    seam's adapter and the releases it serves, or none), ``skipped``, ``all_match``, ``enabled``,
    ``pending`` (install() is waiting for ``trigger`` to be imported), ``install`` (what install()
    did or would do, in words) and ``note``."""
    out = []
    for integ in table.integrations():
        item = integ.status()
        item["trigger"] = integ.trigger
        item["pending"] = importwatch.pending(integ.trigger)
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
