"""Patching library seams exactly and reversibly.

An :class:`Integration` replaces a few functions of a library (its *seams*) with versions that
ask the registry. Enabling checks the library version against the tested range and each seam's
signature, so a library update fails loudly at ``enable()`` instead of half-patching. Every
module that imported a seam by name (``from accelerate.utils import get_max_memory``) holds its
own reference, so the replacement is installed in every such holder, and ``disable()`` puts the
identical original objects back — also in modules imported after ``enable()``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ..errors import IntegrationError

__all__ = ["Integration", "Seam"]

_MARK = "__accelreg_original__"


#: Packages whose modules are scanned for by-name copies of a patched function.
LIBRARIES = ("transformers", "accelerate", "peft", "deepspeed")


@dataclass(frozen=True)
class Seam:
    """One function (or class attribute) to replace.

    Attributes:
        module: Module that defines it (``"accelerate.utils.modeling"``).
        name: Attribute path in that module (``"get_max_memory"`` or ``"Cls.method"``).
        make: ``(original) -> replacement``.
        params: Parameter names the original must have (checked at enable time).
        importers: Modules to import before scanning for holders (late by-name importers).
        fingerprint: For a private function, the first 16 hex digits of the sha256 of its
            source as tested; a different source fails ``enable()``.
        why: One line for docs/integrations.md and ``accelreg env``.
    """

    module: str
    name: str
    make: Callable[[Any], Any]
    params: tuple[str, ...] = ()
    importers: tuple[str, ...] = ()
    fingerprint: str = ""
    why: str = ""


@dataclass
class _Installed:
    holder: Any
    attr: str
    original: Any
    replacement: Any


@dataclass
class Integration:
    """A set of seams in one library, enabled and disabled as a unit."""

    name: str
    distribution: str
    supported: str  # a version range, e.g. ">=5.24,<5.25"
    seams: Sequence[Seam]
    scan_prefixes: tuple[str, ...] = ()
    on_enable: Callable[[], None] | None = None
    on_disable: Callable[[], None] | None = None
    _installed: list[_Installed] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- state ----------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether the seams are installed in this process."""
        return bool(self._installed)

    def version(self) -> str | None:
        """The installed version of :attr:`distribution` (``None`` when not installed)."""
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return None

    def available(self) -> bool:
        """Whether the library is installed (its version may still be untested)."""
        return self.version() is not None

    def status(self) -> dict[str, Any]:
        """``name``, ``library``, ``version``, ``supported``, ``in_range``, ``enabled``, ``note``."""
        version = self.version()
        return {
            "name": self.name,
            "library": self.distribution,
            "version": version,
            "supported": self.supported,
            "in_range": None if version is None else _in_range(version, self.supported),
            "enabled": self.enabled,
            "note": f"{len(self._installed)} holders patched"
            if self.enabled
            else f"tested with {self.supported}",
        }

    # -- enable / disable ------------------------------------------------------------------
    def check(self) -> list[tuple[Seam, Any, Any]]:
        """Import every seam and verify it; returns ``(seam, owner, original)`` triples."""
        version = self.version()
        if version is None:
            raise IntegrationError(f"{self.name}: {self.distribution} is not installed")
        if not _in_range(version, self.supported):
            raise IntegrationError(
                f"{self.name}: {self.distribution} {version} is outside the tested range {self.supported}; "
                "accelreg patches private functions there and will not guess on an untested version "
                "(upgrade accelreg, or pin the library)"
            )
        found = []
        for seam in self.seams:
            try:
                module = importlib.import_module(seam.module)
            except ImportError as exc:
                raise IntegrationError(f"{self.name}: cannot import {seam.module}: {exc}") from exc
            owner, attr = _owner(module, seam.name)
            original = (
                inspect.getattr_static(owner, attr, None)
                if isinstance(owner, type)
                else getattr(owner, attr, None)
            )
            if original is None:
                raise IntegrationError(
                    f"{self.name}: {seam.module}.{seam.name} no longer exists in {self.distribution} {version}"
                )
            func = getattr(original, "__func__", original)
            if getattr(func, _MARK, None) is not None:
                raise IntegrationError(
                    f"{self.name}: {seam.module}.{seam.name} is already patched by accelreg"
                )
            if seam.params:
                try:
                    have = tuple(inspect.signature(func).parameters)
                except (TypeError, ValueError) as exc:
                    raise IntegrationError(
                        f"{self.name}: cannot inspect {seam.module}.{seam.name}: {exc}"
                    ) from exc
                missing = [p for p in seam.params if p not in have]
                if missing:
                    raise IntegrationError(
                        f"{self.name}: {seam.module}.{seam.name} changed in {self.distribution} {version}: "
                        f"parameters {missing} are gone (it has {list(have)})"
                    )
            if seam.fingerprint:
                digest = fingerprint(func)
                if digest != seam.fingerprint:
                    raise IntegrationError(
                        f"{self.name}: the private function {seam.module}.{seam.name} differs from the one accelreg "
                        f"was tested with (source {digest}, tested {seam.fingerprint}) in {self.distribution} {version}"
                    )
            found.append((seam, owner, original))
        return found

    def enable(self) -> None:
        """Install every seam (idempotent); raise :class:`IntegrationError` and change nothing
        when the library version or a seam does not match what was tested."""
        with self._lock:
            if self.enabled:
                return
            checked = self.check()
            installed: list[_Installed] = []
            try:
                for seam, owner, original in checked:
                    for name in seam.importers:
                        # Only where the importer's package is already loaded: importing it
                        # here would drag in a whole library (transformers, peft) the user may
                        # never import. One imported later takes the replacement from the
                        # patched holder, and disable() finds it by its scan.
                        if name.partition(".")[0] not in sys.modules:
                            continue
                        try:
                            importlib.import_module(name)
                        except ImportError:
                            pass
                    replacement = seam.make(getattr(original, "__func__", original))
                    target = getattr(replacement, "__func__", replacement)
                    try:
                        setattr(target, _MARK, original)
                    except AttributeError:
                        pass
                    if isinstance(original, staticmethod):
                        replacement = staticmethod(replacement)
                    elif isinstance(original, classmethod):
                        replacement = classmethod(replacement)
                    attr = seam.name.rsplit(".", 1)[-1]
                    for holder, holder_attr in self._holders(owner, attr, original):
                        setattr(holder, holder_attr, replacement)
                        installed.append(_Installed(holder, holder_attr, original, replacement))
                if self.on_enable is not None:
                    self.on_enable()
            except BaseException:
                for item in reversed(installed):
                    setattr(item.holder, item.attr, item.original)
                raise
            self._installed = installed

    def disable(self) -> None:
        """Put back exactly what was there, in every holder (idempotent)."""
        with self._lock:
            if not self.enabled:
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

    # -- holders ---------------------------------------------------------------------------
    def _modules(self) -> list[Any]:
        prefixes = self.scan_prefixes or (self.distribution.replace("-", "_"),)
        return [
            m
            for name, m in list(sys.modules.items())
            if m is not None and any(name == p or name.startswith(p + ".") for p in prefixes)
        ]

    def _holders(self, owner: Any, attr: str, original: Any) -> list[tuple[Any, str]]:
        if isinstance(owner, type):
            return [(owner, attr)]
        holders = [(owner, attr)]
        for module in self._modules():
            if module is owner:
                continue
            for name, value in list(vars(module).items()):
                if value is original:
                    holders.append((module, name))
        return holders


def _owner(module: Any, dotted: str) -> tuple[Any, str]:
    owner = module
    parts = dotted.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _in_range(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:  # an unparsable version is an untested one
        return False


def fingerprint(func: Any) -> str:
    """sha256 prefix of a function's source, to notice a changed private function."""
    import hashlib

    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return "<no source>"
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def original(fn: Any) -> Any:
    """The upstream function behind an accelreg replacement (``fn`` itself otherwise)."""
    return getattr(getattr(fn, "__func__", fn), _MARK, fn)
