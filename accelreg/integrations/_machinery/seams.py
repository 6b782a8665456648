"""Patching library seams exactly and reversibly, chosen by what each seam *is*.

An :class:`Integration` replaces a few functions of a library (its *seams*) with versions that
ask the registry. Each seam has one or more :class:`Adapter` records, one per known shape of
the upstream function: the adapter whose shape matches — its normalised source fingerprint
(:func:`shape`), its parameters, a behaviour probe — is the one installed. Each adapter also
declares the releases it serves, and each integration the range of releases it serves: together
they are the integrations table (``accelreg.integrations.table``). The version number is never
the guard: a release outside the table is a *conflict*, named in one warning before anything is
patched (strict mode: an error), and its seams are then matched by shape like any other; a seam
that matches no adapter is skipped *alone*, with one
:class:`IntegrationWarning` naming what is lost and the patch-free alternative; in strict mode
(``ACCELREG_STRICT`` / ``configure(strict=True)``) ``enable()`` raises instead, patching nothing.

Every module that imported a seam by name (``from accelerate.utils import get_max_memory``)
holds its own reference, so the replacement is installed in every such holder, and
``disable()`` puts the identical original objects back — also in modules imported after
``enable()``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ... import registry
from ...deferred import raise_recorded, record
from ...errors import IntegrationError
from . import shapecache
from .releases import Releases
from .shapes import ABSENT, forget_sources, node_in_source, params_of_node, shape

__all__ = [
    "PATCH_FREE",
    "Adapter",
    "Integration",
    "IntegrationWarning",
    "Match",
    "Seam",
    "enable_in_hook",
    "import_in_hook",
    "installed_version",
    "outside_releases",
    "raise_recorded",
    "report_conflicts",
    "shape",
    "strict_mode",
]

log = logging.getLogger("accelreg.integrations")

_MARK = "__accelreg_original__"

#: Packages whose modules are scanned for by-name copies of a patched function.
LIBRARIES = ("transformers", "accelerate", "peft", "deepspeed")

#: What a user whose seam was skipped can call instead (works on every release, patches nothing).
PATCH_FREE = (
    "the patch-free accelreg.device_map_for(model_or_config_or_folder, max_memory) returns a fully "
    "qualified device map to pass as from_pretrained(device_map=...) or dispatch_model(...)"
)


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` when it is not installed), as
    ``importlib.metadata.version`` answers it.

    ``install()`` asks once per row of the integrations table in every process of a job, and
    ``importlib.metadata`` searches every folder of ``sys.path`` again for each name (a missing
    one costs a full search) and parses the whole metadata file. Instead each folder of the
    import path is listed once, the first ``<name>-<version>.dist-info`` of the name answers from
    its folder's name, and anything else (an ``.egg-info``, a folder name without a version)
    asks ``importlib.metadata``. Answers are remembered for the import path they were found on
    (a changed ``sys.path`` looks again).
    """
    index = _distributions()
    found = index.get(_normalize(distribution), _MISSING)
    if found is _MISSING and not index.get(_ARCHIVES):
        return None  # no folder of the path has it, and there is nowhere else to look
    if found is not _MISSING and found is not None:
        return found
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_MISSING = object()
_ARCHIVES = "<archives on the path>"  # not a valid distribution name
#: (sys.path, {normalized name: version from the folder name, or None: ask importlib.metadata})
_index: tuple[tuple[str, ...], dict[str, Any]] | None = None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions() -> dict[str, Any]:
    global _index
    path = tuple(sys.path)
    if _index is not None and _index[0] == path:
        return _index[1]
    index: dict[str, Any] = {}
    for folder in path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            if os.path.isfile(folder):
                index[_ARCHIVES] = True  # a zip on the path: importlib.metadata looks inside
            continue
        for entry in names:
            stem, dot, suffix = entry.rpartition(".")
            if not dot or suffix not in ("dist-info", "egg-info"):
                continue
            name, dash, version = stem.partition("-")
            key = _normalize(name)
            if key in index:
                continue  # the first on the path is the one importlib.metadata reads
            index[key] = version if suffix == "dist-info" and dash and version else None
    _index = (path, index)
    return index


class IntegrationWarning(UserWarning):
    """A seam of an installed library matched no adapter and was skipped (the others are on)."""


@dataclass(frozen=True)
class Adapter:
    """One known shape of a seam, the releases it serves, and the replacement for it.

    Attributes:
        releases: The releases of the library this adapter was verified with (a
            :class:`~.releases.Releases` range, ``">=5.13,<5.25"``): a row of the integrations
            table. Declared, never a guard: the adapter is chosen by its shape; a release outside
            every adapter's range of a seam is named before anything is patched.
        make: ``(original) -> replacement``; ``None`` when this shape needs no replacement
            (upstream already does the right thing there), so nothing is patched.
        shapes: :func:`shape` fingerprints (or raw-source :func:`fingerprint` values) of the
            upstream function this adapter was tested with; empty accepts any source (public
            functions, guarded by ``params`` alone).
        params: Parameter names the original must have.
        probe: ``(original) -> bool``, a behaviour check run at enable time (not by the static
            survey); ``False`` means the adapter does not fit.
        module: Where the seam lives in this shape, when not at :attr:`Seam.module`.
        target: The attribute path checked (and patched, with ``make``) in this shape, when not
            :attr:`Seam.name`: a release where the seam's job is done by another function.
        absent: This shape is the seam's *absence*: it matches when the module exists and the
            attribute does not (a release older than the code the seam fixes); ``make`` must be
            ``None``.
        note: What this shape does differently, in a few words (``"on request only"``).
    """

    releases: Releases | str
    make: Callable[[Any], Any] | None
    shapes: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    probe: Callable[[Any], bool] | None = None
    module: str = ""
    target: str = ""
    absent: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.releases, Releases):
            object.__setattr__(self, "releases", Releases(self.releases))
        if self.absent and self.make is not None:
            raise ValueError("an adapter for a seam's absence patches nothing (make=None)")

    @property
    def name(self) -> str:
        """The label ``accelreg env`` and docs/compatibility.md show: the releases, and the note."""
        return f"{self.releases}: {self.note}" if self.note else str(self.releases)


@dataclass(frozen=True)
class Seam:
    """One function (or class attribute) to replace.

    Attributes:
        module: Module that defines it (``"accelerate.utils.modeling"``).
        name: Attribute path in that module (``"get_max_memory"`` or ``"Cls.method"``).
        make: ``(original) -> replacement`` of the single implicit adapter (when ``adapters``
            is empty; it serves the integration's whole release range).
        params: Parameter names of the implicit adapter.
        importers: Modules known to import the function by name (``from accelerate.utils import
            get_max_memory``): a loaded one is patched with every other holder; one not loaded
            is not imported (it takes the replacement from the patched module it imports from
            when it is imported, and ``disable()`` finds it by its scan). The tests import them
            all, to check every copy is patched and restored.
        fingerprint: Raw-source fingerprint of the implicit adapter (private functions).
        why: One line: what the replacement does (docs, ``accelreg env``, the skip warning).
        adapters: The known shapes, tried in order; the first that matches is installed.
        instead: What a user whose seam was skipped can do without it (the skip warning);
            empty: :data:`PATCH_FREE`.
    """

    module: str
    name: str
    make: Callable[[Any], Any] | None = None
    params: tuple[str, ...] = ()
    importers: tuple[str, ...] = ()
    fingerprint: str = ""
    why: str = ""
    adapters: tuple[Adapter, ...] = ()
    instead: str = ""

    def candidates(self, window: Releases) -> tuple[Adapter, ...]:
        """The adapters to try, in order: the declared ones, or the single implicit adapter
        (``make``, ``params``, ``fingerprint``), which serves the integration's whole ``window``."""
        if self.adapters:
            return self.adapters
        shapes = (self.fingerprint,) if self.fingerprint else ()
        return (Adapter(window, self.make, shapes=shapes, params=self.params),)


@dataclass(frozen=True)
class Match:
    """The outcome of matching one seam: the adapter chosen, or why none fits."""

    seam: Seam
    adapter: Adapter | None
    owner: Any = None
    original: Any = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``status()`` and ``accelreg env --json``."""
        return {
            "seam": f"{self.seam.module}.{self.seam.name}",
            "adapter": self.adapter.name if self.adapter else None,
            "releases": str(self.adapter.releases) if self.adapter else None,
            "patched": bool(self.adapter and self.adapter.make),
            "reason": self.reason,
        }


#: (integration, release) pairs whose conflicts were already reported in this process.
_reported: set[tuple[str, str | None]] = set()
_reported_lock = threading.Lock()


@dataclass
class _Installed:
    holder: Any
    attr: str
    original: Any
    replacement: Any


@dataclass
class Integration:
    """One host library's integration: a row of the integrations table, and its seams, enabled
    and disabled as a unit.

    This is the whole shape of an integration. A host library's folder
    (``accelreg/integrations/<library>/``, or a third party's module registered through the
    ``accelreg.integrations`` entry-point group) defines its seams, one ``INTEGRATION`` of this
    class, and takes its public functions from it::

        INTEGRATION = Integration(name="fooml", distribution="fooml", trigger="fooml",
                                  releases=">=1.2,<1.5", tested={"oldest": "1.2.0"}, seams=[...])
        enable, disable, enabled = INTEGRATION.api()

    A built-in takes the fields the integrations table holds as data from its row
    (``Integration(**table.row("peft").declared(), seams=[...])``).

    :func:`accelreg.install` enables it when :attr:`trigger` is imported (after running
    :attr:`prepare`, if any), :func:`accelreg.integrations.uninstall` disables it (after
    :attr:`unprepare`), and ``accelreg env`` reports :meth:`status`.

    Attributes:
        name: The integration's name (``accelreg.integrations.<name>`` for the built-ins).
        distribution: The host library's distribution (its version is read from it).
        trigger: The library module whose import enables it: one imported only once its package
            is complete (firing on a submodule the package ``__init__`` is still importing would
            make ``enable()`` import from a partially initialised package).
        releases: The releases this integration serves (a :class:`~.releases.Releases` range):
            every seam's adapters together must cover it. An installed release outside it is a
            *conflict*, named before anything is patched (strict mode: an error).
        seams: The functions replaced.
        tested: The exact release the release matrix runs for each set it runs
            (``{"oldest": "1.10.1", "newest": "1.16.0"}``): noxfile.py builds its sets from these.
        scan_prefixes: Packages scanned for by-name copies of a patched function (default: the
            distribution's import name).
        on_enable / on_disable: Work beyond the seams, run inside ``enable()`` / ``disable()``
            (DeepSpeed's accelerator hand-over, registering a Lightning accelerator).
        prepare / unprepare: Work ``install()`` must do before the library first runs (imports
            nothing), and its undoing.
        add_status: ``(integration, item) -> None``: adds what this integration alone knows to
            its :meth:`status` item (DeepSpeed: whose accelerator it runs on).
        follower: ``install()`` enables it like every row, but the import of :attr:`trigger` does
            not make an armed job process's start-up hook call ``install()``
            (:func:`~accelreg.integrations.table.triggers` leaves it out): a module every process
            imports (``torch.accelerator``) must not make every process pay for ``install()``; a
            host library's import does, and that library imports the follower's first. A
            built-in follower is also named in ``table.FOLLOWERS``, which the start-up hook reads
            without importing this.
    """

    name: str
    distribution: str
    trigger: str
    releases: Releases | str
    seams: Sequence[Seam]
    tested: Mapping[str, str] = field(default_factory=dict)
    scan_prefixes: tuple[str, ...] = ()
    on_enable: Callable[[], None] | None = None
    on_disable: Callable[[], None] | None = None
    prepare: Callable[[], None] | None = None
    unprepare: Callable[[], None] | None = None
    add_status: Callable[[Integration, dict[str, Any]], None] | None = None
    follower: bool = False
    _installed: list[_Installed] = field(default_factory=list)
    _matches: list[Match] = field(default_factory=list)
    _on: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        if not isinstance(self.releases, Releases):
            self.releases = Releases(self.releases)
        for set_name, release in self.tested.items():
            if release not in self.releases:
                raise ValueError(
                    f"{self.name}: the {set_name} set's {self.distribution} {release} is outside the "
                    f"releases it serves ({self.releases})"
                )

    # -- state ----------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether the integration is on in this process (its matching seams installed)."""
        return self._on

    @property
    def skipped(self) -> list[Match]:
        """Seams that matched no adapter when the integration was enabled."""
        return [m for m in self._matches if m.adapter is None]

    @property
    def window(self) -> Releases:
        """:attr:`releases`, typed."""
        assert isinstance(self.releases, Releases)
        return self.releases

    def version(self) -> str | None:
        """The installed version of :attr:`distribution` (``None`` when not installed)."""
        return installed_version(self.distribution)

    def available(self) -> bool:
        """Whether the library is installed."""
        return self.version() is not None

    def serves(self, version: str | None = None) -> bool | None:
        """Whether ``version`` (default: the installed one) is in :attr:`releases` (``None``
        when the library is not installed)."""
        version = version or self.version()
        return None if version is None else version in self.window

    def conflicts(self, version: str | None = None) -> list[str]:
        """What the table says against ``version`` (default: the installed one), one line each:
        a release outside :attr:`releases`, or, inside it, a seam none of whose adapters serves
        it (a gap in the table). Empty when the library is not installed or all is well."""
        version = version or self.version()
        if version is None:
            return []
        outside = outside_releases(self.name, self.distribution, self.window, version)
        if outside:
            return outside
        return [
            f"{self.distribution} {version}: no adapter of seam {seam.name} serves it "
            f"(they serve {' / '.join(str(a.releases) for a in seam.candidates(self.window))})"
            for seam in self.seams
            if not any(version in a.releases for a in seam.candidates(self.window))
        ]

    def status(self) -> dict[str, Any]:
        """``name``, ``library``, ``version``, ``releases`` (the range it serves), ``in_range``,
        ``tested`` (the release matrix's releases), ``conflicts``, ``enabled``, ``seams`` (each
        seam's adapter, from the live functions when enabled, else from a static read of the
        installed sources: nothing is imported), ``skipped`` and ``note``."""
        version = self.version()
        item: dict[str, Any] = {
            "name": self.name,
            "library": self.distribution,
            "version": version,
            "releases": str(self.releases),
            "in_range": self.serves(version),
            "tested": dict(self.tested),
            "conflicts": self.conflicts(version),
            "enabled": self.enabled,
        }
        if version is None:
            item.update(seams=[], skipped=[], note="not installed")
            return item
        matches = list(self._matches) if self.enabled else self.survey()
        item["seams"] = [m.as_dict() for m in matches]
        item["skipped"] = [m.as_dict()["seam"] for m in matches if m.adapter is None]
        item["all_match"] = not item["skipped"]
        item["note"] = self.summary(version, matches)
        if self.add_status is not None:
            self.add_status(self, item)
        return item

    def summary(self, version: str, matches: Sequence[Match]) -> str:
        """One line: served or not, and whether every seam matches."""
        missed = [m for m in matches if m.adapter is None]
        listed = (
            f"in the releases it serves ({self.releases})"
            if self.serves(version)
            else f"outside the releases it serves ({self.releases})"
        )
        seams = (
            "all seams match"
            if not missed
            else f"{len(missed)} of {len(matches)} seams match no adapter and are skipped: "
            + ", ".join(m.seam.name for m in missed)
        )
        holders = f"; {len(self._installed)} holders patched" if self.enabled else ""
        return f"{self.distribution} {version}: {listed}; {seams}{holders}"

    # -- matching -------------------------------------------------------------------------
    def match(self) -> list[Match]:
        """Import every seam's module and choose its adapter; nothing is patched. The shapes
        of the library's functions come from the on-disk cache of this release where another
        process computed them (:mod:`.shapecache`)."""
        try:
            return [_match_live(self, seam) for seam in self.seams]
        finally:
            shapecache.save()

    def survey(self, root: str | None = None) -> list[Match]:
        """Choose each seam's adapter from the library's *source files*, importing nothing
        (probes are not run): what ``accelreg env`` shows in a process that has not imported
        the library, and what docs/compatibility.md lists for every release in the window
        (``root``: a folder holding one release's unpacked packages, read once)."""
        try:
            return [_match_static(self, seam, root) for seam in self.seams]
        finally:
            if root is not None:
                forget_sources()

    # -- enable / disable ------------------------------------------------------------------
    def check(self) -> list[tuple[Seam, Any, Any]]:
        """Match every seam and raise :class:`IntegrationError` when one matches no adapter;
        returns ``(seam, owner, original)`` of the seams a replacement is installed for."""
        matches = self._matched(strict=True)
        return [(m.seam, m.owner, m.original) for m in matches if m.adapter and m.adapter.make]

    def report_conflicts(self, *, strict: bool) -> list[str]:
        """Name the :meth:`conflicts` of the installed release before anything is patched: in
        strict mode an :class:`IntegrationError`, otherwise one :class:`IntegrationWarning` (once
        per process and release). Returns them."""
        return report_conflicts(self.name, self.version(), self.conflicts(), strict=strict, stacklevel=4)

    def _matched(self, strict: bool) -> list[Match]:
        version = self.version()
        if version is None:
            raise IntegrationError(f"{self.name}: {self.distribution} is not installed")
        self.report_conflicts(strict=strict)
        matches = self.match()
        missed = [m for m in matches if m.adapter is None]
        if missed and strict:
            raise IntegrationError(
                f"{self.name}: {len(missed)} seam(s) of {self.distribution} {version} match no adapter "
                "(strict mode: nothing was patched): " + "; ".join(m.reason for m in missed)
            )
        return matches

    def enable(self, *, strict: bool | None = None) -> None:
        """Install every seam whose adapter matches (idempotent).

        A seam that matches no adapter is skipped with one :class:`IntegrationWarning`; with
        ``strict`` (default: the registry's ``strict`` setting) :class:`IntegrationError` is
        raised instead and nothing is patched.
        """
        with self._lock:
            if self._on:
                return
            strict = strict_mode() if strict is None else strict
            matches = self._matched(strict)
            installed: list[_Installed] = []
            patched = [m for m in matches if m.adapter is not None and m.adapter.make is not None]
            try:
                # one pass over the library's modules finds every by-name copy of every seam
                index = self._copies({id(m.original) for m in patched if not isinstance(m.owner, type)})
                for m in patched:
                    installed.extend(self._install(m, index))
                if self.on_enable is not None:
                    self.on_enable()
            except BaseException:
                for item in reversed(installed):
                    setattr(item.holder, item.attr, item.original)
                raise
            self._installed = installed
            self._matches = matches
            self._on = True
        version = self.version() or "?"
        for m in matches:
            if m.adapter is None:
                warnings.warn(
                    IntegrationWarning(
                        f"accelreg: {self.name} {version}: seam {m.seam.module}.{m.seam.name} skipped "
                        f"({m.reason}); lost: {m.seam.why or 'its fix'}. The other seams are on. "
                        f"Instead: {m.seam.instead or PATCH_FREE}"
                    ),
                    stacklevel=2,
                )

    def _install(self, m: Match, copies: Mapping[int, list[tuple[Any, str]]]) -> list[_Installed]:
        seam, owner, original, adapter = m.seam, m.owner, m.original, m.adapter
        assert adapter is not None and adapter.make is not None
        replacement = adapter.make(getattr(original, "__func__", original))
        for target in {
            id(t): t for t in (getattr(replacement, "__func__", replacement), _function(replacement))
        }.values():
            try:
                setattr(target, _MARK, original)
            except AttributeError:
                pass
        if isinstance(original, staticmethod):
            replacement = staticmethod(replacement)
        elif isinstance(original, classmethod):
            replacement = classmethod(replacement)
        attr = (adapter.target or seam.name).rsplit(".", 1)[-1]
        out = []
        holders = [(owner, attr)]
        if not isinstance(owner, type):
            holders += [
                (module, name)
                for module, name in copies.get(id(original), ())
                if module is not owner and vars(module).get(name) is original
            ]
        for holder, holder_attr in holders:
            setattr(holder, holder_attr, replacement)
            out.append(_Installed(holder, holder_attr, original, replacement))
        return out

    def disable(self) -> None:
        """Put back exactly what was there, in every holder (idempotent)."""
        with self._lock:
            if not self._on:
                return
            if self.on_disable is not None:
                self.on_disable()
            swaps = {id(i.replacement): i.original for i in self._installed}
            for item in reversed(self._installed):
                setattr(item.holder, item.attr, item.original)
            # modules imported after enable() may hold a replacement by name: restore them too
            for module in self._modules():
                for attr, value in list(vars(module).items()):
                    original = swaps.get(id(value))
                    if original is not None:
                        setattr(module, attr, original)
            self._installed = []
            self._matches = []
            self._on = False

    @contextmanager
    def enabled_for(self) -> Iterator[None]:
        """``with integration.enabled_for(): ...`` enables for the block, then restores."""
        was = self.enabled
        self.enable()
        try:
            yield
        finally:
            if not was:
                self.disable()

    def api(self) -> tuple[Callable[[], None], Callable[[], None], Callable[[], Any]]:
        """The module functions of this integration: ``enable``, ``disable``, ``enabled``.

        ``enable()`` first raises a failure recorded while an import hook enabled an
        integration in strict mode (:func:`raise_recorded`), then enables this one (idempotent;
        see :meth:`enable`); ``disable()`` restores the library exactly as it was;
        ``enabled()`` is a context manager enabling it for a block.
        """
        library = f"{self.name} ({self.distribution})"
        module = sys._getframe(1).f_globals.get("__name__", f"accelreg.integrations.{self.name}")

        def enable() -> None:
            raise_recorded()
            self.enable()

        def disable() -> None:
            self.disable()

        @contextmanager
        def enabled() -> Iterator[None]:
            with self.enabled_for():
                yield

        enable.__doc__ = (
            f"Enable the {library} integration (idempotent): install every seam whose adapter "
            "matches; in strict mode a seam that matches none raises IntegrationError."
        )
        disable.__doc__ = f"Restore {self.distribution} exactly as it was (idempotent)."
        enabled.__doc__ = f"Enable the {library} integration for a ``with`` block, then restore."
        for fn in (enable, disable, enabled):
            fn.__module__ = module
            fn.__qualname__ = fn.__name__
        return enable, disable, enabled

    # -- holders ---------------------------------------------------------------------------
    def _modules(self) -> list[Any]:
        """The loaded modules of the packages scanned for copies (:attr:`scan_prefixes`)."""
        prefixes = self.scan_prefixes or (self.distribution.replace("-", "_"),)
        dotted = tuple(p + "." for p in prefixes)
        index = _package_index()
        out = []
        for top in dict.fromkeys(p.partition(".")[0] for p in prefixes):
            for name in index.get(top, ()):
                m = sys.modules.get(name)  # the live module: a name's entry may have been replaced
                if m is not None and (name in prefixes or name.startswith(dotted)):
                    out.append(m)
        return out

    def _copies(self, wanted: set[int]) -> dict[int, list[tuple[Any, str]]]:
        """``id(object) -> [(module, name), ...]``: every module attribute of the scanned
        packages bound to one of the ``wanted`` objects (the by-name imports of a seam's
        function, ``from accelerate.utils import get_max_memory``), found in one pass."""
        found: dict[int, list[tuple[Any, str]]] = {}
        if not wanted:
            return found
        for module in self._modules():
            names = vars(module)
            if wanted.isdisjoint(map(id, list(names.values()))):
                continue  # the common case, decided without a Python-level loop
            for name, value in list(names.items()):
                if id(value) in wanted:
                    found.setdefault(id(value), []).append((module, name))
        return found


_INDEX: tuple[tuple[int, str | None], dict[str, list[str]]] | None = None


def _package_index() -> dict[str, list[str]]:
    """The names in ``sys.modules`` grouped by top-level package, rebuilt whenever a module was
    added or removed since (the count and the last name inserted say so): the integrations that
    one ``install()`` enables share one pass over the process's thousands of modules."""
    global _INDEX
    modules = sys.modules
    key = (len(modules), next(reversed(modules), None))
    cached = _INDEX
    if cached is not None and cached[0] == key:
        return cached[1]
    index: dict[str, list[str]] = {}
    for name in list(modules):
        index.setdefault(name.partition(".")[0], []).append(name)
    _INDEX = (key, index)
    return index


# -- matching one seam --------------------------------------------------------------------
def _match_live(integ: Integration, seam: Seam) -> Match:
    reasons = []
    for adapter in seam.candidates(integ.window):
        where, name = adapter.module or seam.module, adapter.target or seam.name
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            reasons.append(f"{adapter.name}: {where}.{name} not found ({exc})")
            continue
        try:
            owner, attr = _owner(module, name)
        except AttributeError as exc:
            if adapter.absent:
                return Match(seam, adapter, reason=f"{where}.{name} does not exist in this release")
            reasons.append(f"{adapter.name}: {where}.{name} not found ({exc})")
            continue
        original = (
            inspect.getattr_static(owner, attr, None)
            if isinstance(owner, type)
            else getattr(owner, attr, None)
        )
        if adapter.absent:
            if original is None:
                return Match(seam, adapter, reason=f"{where}.{name} does not exist in this release")
            reasons.append(f"{adapter.name}: {where}.{name} exists")
            continue
        if original is None:
            reasons.append(f"{adapter.name}: {where}.{name} does not exist")
            continue
        func = _function(original)
        if getattr(func, _MARK, None) is not None:
            if adapter.make is None:  # a check-only adapter reads a function another seam patched
                func = _function(getattr(func, _MARK))
            else:
                reasons.append(f"{where}.{name} is already patched by accelreg")
                break
        problem = _fits(adapter, func, lambda f=func: shapecache.digests(f), _params_of(func))
        if problem is None and adapter.probe is not None:
            try:
                ok = bool(adapter.probe(func))
            except Exception as exc:  # noqa: BLE001 - a probe that fails is a non-match
                ok, problem = False, f"probe raised {type(exc).__name__}: {exc}"
            if not ok and problem is None:
                problem = "behaviour probe does not match"
        if problem is None:
            return Match(seam, adapter, owner, original)
        reasons.append(f"{adapter.name}: {where}.{name} {problem}")
    return Match(seam, None, reason="; ".join(reasons) or "no adapter")


def _match_static(integ: Integration, seam: Seam, root: str | None) -> Match:
    reasons = []
    for adapter in seam.candidates(integ.window):
        where, name = adapter.module or seam.module, adapter.target or seam.name
        node = node_in_source(where, name, root)
        if adapter.absent:
            if node == ABSENT:
                return Match(seam, adapter, reason="static read of the source: it does not exist")
            reasons.append(f"{adapter.name}: {where}.{name} {node if isinstance(node, str) else 'exists'}")
            continue
        if isinstance(node, str):
            reasons.append(f"{adapter.name}: {where}.{name} {node}")
            continue
        params = params_of_node(node)
        problem = _fits(adapter, node, lambda n=node: (shape(n), ""), params)
        if problem is None:
            return Match(seam, adapter, reason="static read of the source (probes not run)")
        reasons.append(f"{adapter.name}: {where}.{name} {problem}")
    return Match(seam, None, reason="; ".join(reasons) or "no adapter")


def _fits(
    adapter: Adapter, obj: Any, digests: Callable[[], tuple[str, str]], params: tuple[str, ...] | None
) -> str | None:
    """Why ``adapter`` does not fit the function (``None`` when it does)."""
    if adapter.params:
        if params is None:
            return "has no inspectable signature"
        missing = [p for p in adapter.params if p not in params]
        if missing:
            return f"lacks parameters {missing} (it has {list(params)})"
    if adapter.shapes:
        have = digests()
        if not set(have) & set(adapter.shapes):
            return f"has shape {have[0]}, not one this adapter was tested with ({', '.join(adapter.shapes)})"
    return None


def _function(original: Any) -> Any:
    if isinstance(original, property):
        return original.fget
    if isinstance(original, functools.cached_property):
        return original.func
    return getattr(original, "__func__", original)


def _params_of(func: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None


def _owner(module: Any, dotted: str) -> tuple[Any, str]:
    owner = module
    parts = dotted.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def outside_releases(name: str, distribution: str, releases: Releases | str, version: str) -> list[str]:
    """The conflict of ``version`` with the releases an integration serves, in one line (empty
    when it is among them): what ``install()`` reads from a table row, importing no integration."""
    window = releases if isinstance(releases, Releases) else Releases(releases)
    if version in window:
        return []
    return [
        f"{distribution} {version} is outside the releases the {name} integration serves ({window}); "
        "its seams are matched by shape"
    ]


def report_conflicts(
    name: str, version: str | None, found: list[str], *, strict: bool, stacklevel: int = 3
) -> list[str]:
    """Name ``found``, the conflicts of integration ``name`` with the installed ``version``, before
    anything of it is patched: in strict mode an :class:`IntegrationError`, otherwise one
    :class:`IntegrationWarning` (once per process, integration and release). Returns ``found``."""
    if not found:
        return []
    if strict:
        raise IntegrationError(f"{name}: " + "; ".join(found) + " (strict mode: nothing was patched)")
    key = (name, version)
    with _reported_lock:
        if key in _reported:
            return found
        _reported.add(key)
    warnings.warn(
        IntegrationWarning(
            "accelreg: " + "; ".join(found) + ". `accelreg env` shows what each seam matched; "
            "ACCELREG_STRICT=1 makes this an error"
        ),
        stacklevel=stacklevel,
    )
    return found


def strict_mode() -> bool:
    """Whether the registry's settings are strict (``ACCELREG_STRICT`` / ``configure(strict=True)``).

    Read without loading a plugin (:func:`accelreg.registry.settings`): ``install()`` asks from
    inside the import that triggered it, where building the registry has no business."""
    return bool(registry.settings().strict)


# -- failures inside import hooks ---------------------------------------------------------
def enable_in_hook(integ: Integration) -> None:
    """Enable ``integ`` from the import hook that fired once its library was imported: never
    raises (a failure becomes an :class:`IntegrationWarning`; in strict mode it is also recorded
    for :func:`raise_recorded`)."""
    try:
        integ.enable()
    except Exception as exc:  # noqa: BLE001 - a failure here must not reach the user's import
        _hook_failed(integ.name, "enabled", exc)


def import_in_hook(name: str, load: Callable[[], Integration]) -> Integration | None:
    """Import integration ``name``'s module (``load()``) from the import hook of its library:
    ``None``, with the warning of :func:`enable_in_hook`, when that fails."""
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - a failure here must not reach the user's import
        _hook_failed(name, "loaded", exc)
        return None


def _hook_failed(name: str, stage: str, exc: Exception) -> None:
    try:
        strict = strict_mode()
    except Exception:  # noqa: BLE001 - a broken configuration is reported elsewhere
        strict = False
    if strict:
        record(name, exc)
    message = (
        f"accelreg: the {name} integration could not be {stage} when its library was "
        f"imported ({type(exc).__name__}: {exc}); {name} runs unpatched"
        + ("; strict mode: the next accelreg integration call raises this" if strict else "")
    )
    try:
        warnings.warn(IntegrationWarning(message), stacklevel=3)
    except Exception:  # noqa: BLE001 - warnings turned into errors must not break the import
        log.warning(message)


def original(fn: Any) -> Any:
    """The upstream function behind an accelreg replacement (``fn`` itself otherwise)."""
    return getattr(getattr(fn, "__func__", fn), _MARK, fn)
