"""Integrations: the host libraries ask the registry.

One folder per host library (``accelreg.integrations.<library>``: transformers, accelerate, peft,
safetensors, deepspeed, lightning, ray, vllm, torch), each holding its seams in modules named for what they do
and one :class:`~._machinery.seams.Integration` per row of the integrations table; the machinery
every integration shares sits beside them in :mod:`._machinery` (the seams, the table, release
ranges, shapes). The table (:mod:`._machinery.table`, also ``accelreg.integrations.table``) holds
each row as data — the library, the module whose import enables it, its folder, the releases it
serves — so adding a host library is one new folder and its row; third parties register theirs
through the ``accelreg.integrations`` entry-point group.

:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them, and a library's folder is
imported only once the library is — and nothing it runs inside that import can raise into the
user's ``import`` statement. Before anything is patched, the installed releases are checked
against the table's rows: a release outside them is named (strict mode: an
:class:`~accelreg.errors.IntegrationError`).

This package's ``__init__`` is cheap on purpose (it imports only the import hooks and the
table's static part): a process under ``accelreg run`` imports it at start-up
(:mod:`accelreg.launch.startup`) and must not pay for the registry or any integration module
before a host library is imported. The shared shapes third parties build an integration from
(``Integration``, ``Seam``, ``Adapter``, ``Releases``, ``IntegrationWarning``, ...) are served by
name on first use.
"""

from __future__ import annotations

import importlib

from .. import importwatch
from ..deferred import raise_recorded
from ..errors import IntegrationError
from . import _moved
from ._machinery import table

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._machinery.releases import Releases
    from ._machinery.seams import (
        PATCH_FREE,
        Adapter,
        Integration,
        IntegrationWarning,
        Match,
        Seam,
        installed_version,
        original,
        shape,
    )

__all__ = [
    "PATCH_FREE",
    "Adapter",
    "Integration",
    "IntegrationWarning",
    "Match",
    "Releases",
    "Seam",
    "install",
    "installed_version",
    "integration",
    "original",
    "raise_recorded",
    "shape",
    "status",
    "table",
    "uninstall",
]

#: The shared shapes, served from :mod:`._machinery` on first use (name -> its module).
_SHARED = {
    "PATCH_FREE": "seams",
    "Adapter": "seams",
    "Integration": "seams",
    "IntegrationWarning": "seams",
    "Match": "seams",
    "Seam": "seams",
    "installed_version": "seams",
    "shape": "seams",
    "original": "seams",
    "Releases": "releases",
}

_moved.install_aliases(__name__)


def __getattr__(name: str) -> Any:
    if name in _SHARED:
        value = getattr(importlib.import_module(f"{__name__}._machinery.{_SHARED[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def integration(name: str) -> Integration:
    """The :class:`~._machinery.seams.Integration` called ``name``, a row of the table (importing
    its folder, which imports nothing of the library itself)."""
    return table.integration(name)


def _library_installed(trigger: str) -> bool:
    import importlib.util  # not at start-up: this package is imported in every job process

    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _deferred(action: Callable[[], None]) -> bool:
    """Hand ``action`` to the registry to run once it has finished running plugin code, when
    this hook fired inside plugin code (a vendor's plugin importing a host library at module
    level, while the registry loads it: asking the registry there is refused). Returns whether
    it was deferred."""
    from ..registry.containment import inside_plugin

    if not inside_plugin():
        return False
    from .. import registry

    registry.after_build(action)
    return True


def _enable_row(row: table.Row) -> None:
    """The import hook of a built-in row: import its folder (now that the library is loaded)
    and enable it; nothing raised reaches the user's ``import``."""
    from ._machinery.seams import enable_in_hook, import_in_hook

    if _deferred(lambda: _enable_row(row)):
        return
    integ = import_in_hook(row.name, lambda: table.load_builtin(row))
    if integ is not None:
        enable_in_hook(integ)


def _enable_external(integ: Integration) -> None:
    """The import hook of a third party's integration (see :func:`_enable_row`)."""
    from ._machinery.seams import enable_in_hook

    if not _deferred(lambda: _enable_external(integ)):
        enable_in_hook(integ)


def _arm_early(row: table.Row) -> None:
    """Watch a row's ``early`` module: when it is imported (inside the library's own import),
    import the row's folder and call its ``early`` function with that module."""
    if row.early is None:
        return
    from ._machinery.seams import import_in_hook

    watched, function = row.early

    def fire(module: Any) -> None:
        if _deferred(lambda: fire(module)):
            return
        if import_in_hook(row.name, lambda: table.load_builtin(row)) is not None:
            getattr(importlib.import_module(row.module), function)(module)

    importwatch.when_imported(watched, fire)


def install() -> list[str]:
    """Enable every integration whose library is installed; returns their names.

    First the conflict report: an installed release outside the integrations table (a release
    its adapters were not verified with) is named in one :class:`IntegrationWarning` per
    integration, before anything is patched — read from the table's rows, importing no
    integration; its seams are then matched by shape like any other. An integration is enabled
    when its library module is first imported (or now, if it already is): only then is its
    folder imported. A seam that matches no adapter is skipped with an
    :class:`IntegrationWarning`, and nothing raised there reaches the user's ``import``. In
    strict mode (``ACCELREG_STRICT=1`` / ``configure(strict=True)``) every installed library is
    imported and enabled *now*, so a seam that matches no adapter raises
    :class:`~accelreg.errors.IntegrationError` from this call (so do a conflict and a
    third-party integration that failed to load, before anything is patched); the integrations it
    enabled are disabled again first, so a failed ``install()`` leaves nothing half-installed.
    """
    from ._machinery.seams import installed_version, outside_releases, report_conflicts, strict_mode

    raise_recorded()
    strict = strict_mode()
    external = table.externals()
    if strict and table.failures():
        failure = table.failures()[0]
        raise IntegrationError(
            f"strict mode: the integration {failure.entry_point!r} of {failure.distribution} could not be "
            f"loaded: {failure.reason}"
        )
    rows = [r for r in table.ROWS if r.name not in external and _library_installed(r.trigger)]
    others = [i for i in external.values() if _library_installed(i.trigger)]
    for row in rows:  # the conflict report, from the rows: before anything is patched
        version = _row_version(row, installed_version)
        if version is not None:
            found = outside_releases(
                row.name, _row_distribution(row, installed_version), row.releases, version
            )
            report_conflicts(row.name, version, found, strict=strict)
    for integ in others:
        integ.report_conflicts(strict=strict)
    if strict:
        return _install_now(rows, others)
    names: list[str] = []
    for row in rows:
        _arm_early(row)
        importwatch.when_imported(row.trigger, lambda _module, r=row: _enable_row(r))
        names.append(row.name)
    for integ in others:
        if integ.prepare is not None:
            integ.prepare()  # work that must happen before the library first runs (imports nothing)
        importwatch.when_imported(integ.trigger, lambda _module, i=integ: _enable_external(i))
        names.append(integ.name)
    return names


def _row_distribution(row: table.Row, version_of: Any) -> str:
    for name in row.distributions:
        if version_of(name) is not None:
            return name
    return row.distribution


def _row_version(row: table.Row, version_of: Any) -> str | None:
    return version_of(_row_distribution(row, version_of))


def _install_now(rows: list[table.Row], others: list[Integration]) -> list[str]:
    """Strict mode: import every installed library and enable its integration now; on a
    failure, disable again what this call enabled and raise."""
    chosen: list[tuple[table.Row | None, Integration]] = [(row, table.load_builtin(row)) for row in rows]
    chosen += [(None, integ) for integ in others]
    for _row, integ in chosen:
        integ.report_conflicts(strict=True)  # a gap in the table: before anything is patched
    before = {integ.name for _row, integ in chosen if integ.enabled}
    done: list[tuple[table.Row | None, Integration]] = []
    try:
        for row, integ in chosen:
            done.append((row, integ))
            if row is not None:
                _arm_early(row)  # work that must happen before the library first runs
            elif integ.prepare is not None:
                integ.prepare()
            importlib.import_module(integ.trigger)
            integ.enable()  # reads the strict setting: raises on a seam it cannot match
    except BaseException:
        for row, integ in done:
            if row is not None and row.early is not None:
                importwatch.cancel(row.early[0])
            importwatch.cancel(integ.trigger)
            if integ.name not in before:
                integ.disable()
        raise
    return [integ.name for _row, integ in chosen]


def uninstall() -> None:
    """Disable every integration and forget pending ones (a library's folder that was never
    imported has nothing to undo and stays unimported)."""
    import sys

    external = table.externals()
    for row in table.ROWS:
        importwatch.cancel(row.trigger)
        if row.early is not None:
            importwatch.cancel(row.early[0])
        if row.name in external or row.module not in sys.modules:
            continue
        _undo(table.load_builtin(row))
    for integ in external.values():
        importwatch.cancel(integ.trigger)
        _undo(integ)


def _undo(integ: Integration) -> None:
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
