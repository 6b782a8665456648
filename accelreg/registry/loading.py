"""Plugin loading: entry points, the pluggy manager, hook calls, and the registry's own copy of
every record a plugin yields.

External plugins are imported and their hooks called on the probe thread, under the probe
timeout; accelreg's built-in plugins run in the caller's thread without one (they are part of
accelreg, import nothing slow, and the ``cpu`` backend must exist whatever the timeout). Either
way a failure is contained and recorded by the snapshot (see :mod:`.containment`).
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import entrypoints
from ..config import NAME_RE
from ..types import BackendSpec
from .containment import CONTAINED, Nonsense, call_inline, call_with_timeout, describe, safe_repr

if TYPE_CHECKING:
    from .snapshot import Snapshot

__all__ = ["ENTRY_POINT_GROUP", "RESERVED", "SELF", "Plugin", "call_hook", "load_plugins", "own_spec"]

ENTRY_POINT_GROUP = "accelreg"
SELF = "accelreg"
#: Names a backend may not take: they mean something else in a device map.
RESERVED = frozenset({"auto", "disk", "meta", "balanced", "balanced_low_0", "sequential"})
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,7}")
_OPTIONAL_CALLABLES = ("current_index", "device", "memory_info", "parse_visible_devices", "presence")


class Plugin(NamedTuple):
    """A loaded plugin object and where it came from."""

    name: str
    obj: Any
    distribution: str
    version: str
    builtin: bool


def norm(dist: str) -> str:
    """A distribution name normalised the way packaging compares them."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def self_version() -> str:
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


def load_plugins(snap: Snapshot, registered: Mapping[str, Any]) -> list[Plugin]:
    """Import every plugin the settings allow: entry points, built-ins, ``register()``\\ ed ones."""
    s = snap.settings
    disabled = set(s.disable)
    plugins: list[Plugin] = []
    try:
        eps = entrypoints.find(ENTRY_POINT_GROUP)
    except CONTAINED as exc:  # a corrupt dist-info must not break resolve
        snap.fail(Plugin("<entry points>", None, "", "", False), "entry-point scan", exc)
        eps = []
    have_builtins = False
    for ep in eps:
        dist_name, version = ep.distribution, ep.version
        builtin = norm(dist_name or "") == SELF
        have_builtins |= builtin
        why = None
        if ep.name in disabled and not builtin:
            # A disabled external plugin is never imported; a disabled built-in is kept so
            # that `accelreg env` can show the backend as "disabled by ...".
            why = f"disabled by {s.sources.get('disable', 'configuration')}"
        elif not builtin and s.disable_plugin_autoload:
            why = f"external plugin autoload is off ({s.sources.get('disable_plugin_autoload')})"
        elif not builtin and s.plugins is not None and ep.name not in s.plugins:
            why = f"not in the plugin allowlist ({s.sources.get('plugins')})"
        if why is not None:
            snap.skipped.append((ep.name, dist_name, why))
            continue
        stub = Plugin(ep.name, None, dist_name, version, builtin)
        try:
            obj = call_inline(ep.load) if builtin else call_with_timeout(ep.load, (), s.probe_timeout)
        except CONTAINED as exc:
            snap.fail(stub, "import", exc)
            continue
        plugins.append(Plugin(ep.name, obj, dist_name, version, builtin))
    if not have_builtins:
        # Running from a source tree that was never installed: no entry points exist.
        from ..builtin import BUILTIN_MODULES

        for name, module in BUILTIN_MODULES.items():
            plugins.append(Plugin(name, importlib.import_module(module), SELF, self_version(), True))
    for name, obj in registered.items():
        if name in disabled:
            snap.skipped.append((name, "<registered>", "disabled by configuration"))
            continue
        plugins.append(Plugin(name, obj, "<registered>", "", False))
    return plugins


def make_manager(snap: Snapshot, plugins: list[Plugin]) -> tuple[Any, list[Plugin]]:
    """A pluggy manager holding every plugin it accepts; a plugin it rejects is a failure."""
    import pluggy

    from .. import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    kept: list[Plugin] = []
    for plugin in plugins:
        try:
            pm.register(plugin.obj, name=f"{plugin.distribution}:{plugin.name}")
            unknown = [
                impl.function.__name__
                for hook in pm.hook.__dict__.values()
                if isinstance(hook, pluggy.HookCaller) and not hook.has_spec()
                for impl in hook.get_hookimpls()
                if impl.plugin is plugin.obj
            ]
            if unknown:
                pm.unregister(plugin.obj)
                raise Nonsense(f"implements unknown hook(s) {', '.join(unknown)}")
        except CONTAINED as exc:  # pluggy.PluginValidationError, ValueError, a hostile __getattr__
            snap.fail(plugin, "register", exc)
            continue
        kept.append(plugin)
    return pm, kept


def impls(pm: Any, plugins: Iterable[Plugin], hook: str) -> Iterable[tuple[Plugin, Callable[..., Any]]]:
    """Each plugin's implementation of ``hook``, so each can be called and contained alone."""
    owners = {id(p.obj): p for p in plugins}
    for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
        plugin = owners.get(id(impl.plugin))
        if plugin is not None:
            yield plugin, impl.function


# -- the registry's own copy of a spec ------------------------------------------------------
def own_spec(spec: Any, plugin: Plugin) -> BackendSpec:
    """A validated copy of ``spec`` that the plugin cannot change afterwards.

    Every field of :class:`BackendSpec` is copied (fields added later included); strings and
    ints are copied as exact ``str``/``int``, so a subclass cannot answer differently later.
    Raises :class:`Nonsense` naming the first problem.
    """
    try:
        return _own_spec(spec, plugin)
    except Nonsense:
        raise
    except CONTAINED as exc:
        raise Nonsense(f"yielded an unusable BackendSpec: {describe(exc)}") from None


def _own_spec(spec: Any, plugin: Plugin) -> BackendSpec:
    if not isinstance(spec, BackendSpec):
        raise Nonsense(f"yielded {safe_repr(spec)}, not a BackendSpec")
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(BackendSpec)}
    name = values["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise Nonsense(f"backend name {safe_repr(name)} is not lower case [a-z0-9_], starting with a letter")
    name = values["name"] = str.__str__(name)
    if name in RESERVED:
        raise Nonsense(f"backend name {name!r} is reserved")
    if name == "cpu" and not plugin.builtin:
        raise Nonsense("the cpu backend is accelreg's own; a plugin cannot replace it")
    priority = values["priority"]
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise Nonsense(f"priority of {name!r} must be an int, got {safe_repr(priority)}")
    values["priority"] = operator.index(priority)
    for field_name, pattern, what in (
        ("device_type", NAME_RE, "a valid torch device type"),
        ("visible_devices_var", _ENV_VAR, "an environment variable name"),
        ("runtime_package", _PACKAGE, "an importable package name"),
        ("dist_backend", NAME_RE, "a torch.distributed backend name"),
    ):
        if field_name not in values:
            continue  # a field of a later accelreg (dist_backend) on this version
        value = values[field_name]
        if value is None:
            continue
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise Nonsense(f"{field_name} {safe_repr(value)} of {name!r} is not {what}")
        values[field_name] = str.__str__(value)
    for field_name in ("is_available", "device_count"):
        if not callable(values[field_name]):
            raise Nonsense(f"{field_name} of {name!r} is not callable")
    for field_name in _OPTIONAL_CALLABLES:
        if values[field_name] is not None and not callable(values[field_name]):
            raise Nonsense(f"{field_name} of {name!r} is not callable")
    if not isinstance(values["indexed"], bool):
        raise Nonsense(f"indexed of {name!r} must be True or False, got {safe_repr(values['indexed'])}")
    if not isinstance(values["description"], str):
        raise Nonsense(f"description of {name!r} must be a string")
    values["description"] = str.__str__(values["description"])[:200]
    return BackendSpec(**values)
