"""Plugin loading: entry points, the pluggy manager, and calling one plugin's hook contained.

:func:`load` imports every plugin the settings allow and returns what it found — a
:class:`Loaded` holding the pluggy manager, the plugins it accepted, the ones it skipped and the
failures — without recording anything anywhere: the snapshot decides what a failure means
(strict mode raises).

External plugins are imported and their hooks called on the probe thread, under the probe
timeout; accelreg's built-in plugins run in the caller's thread without one (they are part of
accelreg, import nothing slow, and the ``cpu`` backend must exist whatever the timeout). Either
way a failure is contained (see :mod:`.containment`).

Each plugin's implementation is called alone (:meth:`Loaded.implementations`), so one plugin's
failure is its own; that is why hook wrappers (``hookwrapper=True`` / ``wrapper=True``) are
refused: they would be called as plain implementations. A hook implementation marked
``optionalhook=True`` for a hook this accelreg does not know (a plugin written for a newer
accelreg) is ignored, as pluggy does; an unmarked one is a failure of that plugin.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, NamedTuple

import pluggy

from .. import entrypoints, hookspecs
from ..builtin import BUILTIN_MODULES
from ..config import Settings
from ..entrypoints import norm
from .containment import CONTAINED, Nonsense, call_inline, call_with_timeout

__all__ = ["ENTRY_POINT_GROUP", "SELF", "Loaded", "Plugin", "call_hook", "load"]

ENTRY_POINT_GROUP = "accelreg"
SELF = "accelreg"


class Plugin(NamedTuple):
    """A loaded plugin object and where it came from."""

    name: str
    obj: Any
    distribution: str
    version: str
    builtin: bool


#: A plugin that failed, at which stage, with what.
Failure = tuple[Plugin, str, BaseException]


@dataclass
class Loaded:
    """What loading found: the manager, the plugins it holds, the skipped and the failed."""

    pm: pluggy.PluginManager
    plugins: list[Plugin] = field(default_factory=list)
    #: ``(plugin, distribution, why)`` of plugins the settings kept out (never imported).
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: A plugin module was still being imported (the host library whose import builds this
    #: registry was imported by that module): it may not hold all its hooks yet.
    provisional: bool = False

    def implementations(self, hook: str) -> Iterator[tuple[Plugin, Callable[..., Any]]]:
        """Each plugin's implementation of ``hook``, in pluggy's call order, so each can be
        called and contained alone."""
        owners = {id(p.obj): p for p in self.plugins}
        caller = getattr(self.pm.hook, hook, None)
        if caller is None:
            return
        for impl in reversed(caller.get_hookimpls()):
            plugin = owners.get(id(impl.plugin))
            if plugin is not None:
                yield plugin, impl.function


def self_version() -> str:
    """accelreg's installed version (``"(not installed)"`` in a source tree)."""
    try:
        return metadata.version(SELF)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def call_hook(plugin: Plugin, fn: Callable[..., Any], timeout: float, **kwargs: Any) -> list[Any]:
    """Everything one plugin's hook implementation yields, drained inside the containment."""

    def drain() -> list[Any]:
        return list(fn(**kwargs) or ())

    if plugin.builtin:
        return call_inline(drain)
    return call_with_timeout(drain, (), timeout)


def load(settings: Settings, registered: Mapping[str, Any]) -> Loaded:
    """Import every plugin ``settings`` allow (entry points, built-ins, ``register()``\\ ed
    ones) and register each with a new pluggy manager."""
    loaded = Loaded(_manager())
    for plugin in _import_all(settings, registered, loaded):
        problem = _register(loaded.pm, plugin)
        if problem is None:
            loaded.plugins.append(plugin)
        else:
            loaded.failures.append((plugin, "register", problem))
    return loaded


def _manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _why_skipped(settings: Settings, name: str, builtin: bool) -> str | None:
    s = settings
    if builtin:
        # A disabled built-in is kept so that `accelreg env` can show it as "disabled by ...".
        return None
    if name in s.disable:
        return f"disabled by {s.sources.get('disable', 'configuration')}"
    if s.disable_plugin_autoload:
        return f"external plugin autoload is off ({s.sources.get('disable_plugin_autoload')})"
    if s.plugins is not None and name not in s.plugins:
        return f"not in the plugin allowlist ({s.sources.get('plugins')})"
    return None


def _import_all(settings: Settings, registered: Mapping[str, Any], loaded: Loaded) -> list[Plugin]:
    plugins: list[Plugin] = []
    try:
        eps = entrypoints.find(ENTRY_POINT_GROUP)
    except CONTAINED as exc:  # a corrupt dist-info must not break resolve
        loaded.failures.append((Plugin("<entry points>", None, "", "", False), "entry-point scan", exc))
        eps = []
    have_builtins = False
    for ep in eps:
        builtin = norm(ep.distribution or "") == SELF
        have_builtins |= builtin
        why = _why_skipped(settings, ep.name, builtin)
        if why is not None:
            loaded.skipped.append((ep.name, ep.distribution, why))
            continue
        try:
            obj = call_inline(ep.load) if builtin else call_with_timeout(ep.load, (), settings.probe_timeout)
        except CONTAINED as exc:
            loaded.failures.append(
                (Plugin(ep.name, None, ep.distribution, ep.version, builtin), "import", exc)
            )
            continue
        loaded.provisional |= _still_importing(ep.value)
        plugins.append(Plugin(ep.name, obj, ep.distribution, ep.version, builtin))
    if not have_builtins:
        # Running from a source tree that was never installed: no entry points exist.
        for name, module in BUILTIN_MODULES.items():
            plugins.append(Plugin(name, importlib.import_module(module), SELF, self_version(), True))
    for name, obj in registered.items():
        if name in settings.disable:
            loaded.skipped.append((name, "<registered>", "disabled by configuration"))
            continue
        plugins.append(Plugin(name, obj, "<registered>", "", False))
    return plugins


def _still_importing(value: str) -> bool:
    """Whether the module an entry point names is still being imported (by this thread: an
    import in another thread would have been waited for). Its code may not have defined every
    hook yet."""
    module = sys.modules.get(value.split(":", 1)[0].strip())
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _register(pm: pluggy.PluginManager, plugin: Plugin) -> BaseException | None:
    """Register ``plugin`` with ``pm``; what went wrong (it is unregistered again), or ``None``."""
    try:
        pm.register(plugin.obj, name=f"{plugin.distribution}:{plugin.name}")
    except CONTAINED as exc:  # pluggy.PluginValidationError, ValueError, a hostile __getattr__
        return exc
    try:
        problem = _unusable_impls(pm, plugin)
    except CONTAINED as exc:
        problem = exc
    if problem is not None:
        pm.unregister(plugin.obj)
    return problem


def _unusable_impls(pm: pluggy.PluginManager, plugin: Plugin) -> BaseException | None:
    unknown, wrappers = [], []
    for hook in pm.hook.__dict__.values():
        if not isinstance(hook, pluggy.HookCaller):
            continue
        for impl in hook.get_hookimpls():
            if impl.plugin is not plugin.obj:
                continue
            if not hook.has_spec() and not impl.optionalhook:
                unknown.append(impl.function.__name__)
            elif impl.hookwrapper or impl.wrapper:
                wrappers.append(impl.function.__name__)
    if unknown:
        return Nonsense(
            f"implements unknown hook(s) {', '.join(unknown)} (mark an implementation for a newer "
            "accelreg's hook with @hookimpl(optionalhook=True))"
        )
    if wrappers:
        return Nonsense(
            f"implements {', '.join(wrappers)} as a hook wrapper; accelreg calls each plugin's "
            "implementation alone and contained, so wrappers are not supported"
        )
    return None
