"""The registry: the process-wide snapshot and the public ``configure``/``register``/``reset``.

Nothing here runs at ``import accelreg``. The first query builds a :class:`Snapshot` — the
settings, the loaded plugins and the selected backends in effective order — and every later
query reads that snapshot until :func:`reset` (or :func:`configure`) drops it. A snapshot is
never mutated once published, except for its lazily filled probe results, which are computed
under a per-backend lock, so concurrent readers see one configuration or the next, never half
of each.

Plugins are contained: a plugin that fails to import, or whose hook or probe raises (even
``SystemExit``), hangs, queries accelreg from inside, or answers nonsense, is recorded as a
:class:`~accelreg.types.PluginFailure` and skipped (in strict mode the failure raises
:class:`~accelreg.errors.PluginError` instead).

The jobs live in one file each: :mod:`.containment` (the probe thread, its timeout, the
re-entry guard), :mod:`.loading` (entry points, pluggy, the registry's own copy of each spec),
:mod:`.probing` (a backend's probes and presence), :mod:`.capabilities` (what a device computes
in), :mod:`.snapshot` (selection and queries).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _warn
from ..config import Settings, check_explicit, load_settings
from ..errors import PluginError
from .containment import ProbeTimeout, acquire, call_with_timeout, check_not_inside_plugin, runner

if TYPE_CHECKING:
    from .snapshot import Snapshot

#: What the package serves from the modules that build a snapshot (plugin loading, probing, the
#: records): imported at first use, so reading the settings — all ``install()`` asks of the
#: registry — does not import pluggy and the plugin types (about 12 ms of a rank's start-up).
_LAZY = {
    **dict.fromkeys(("ENTRY_POINT_GROUP", "SELF", "Plugin"), "loading"),
    **dict.fromkeys(("Backend", "Probed", "parse_visible"), "probing"),
    "RESERVED": "records",
    **dict.fromkeys(
        (
            "DEVICE_ID_VAR",
            "LAUNCHER_VARS",
            "LOCAL_RANK_VARS",
            "LOCAL_SIZE_VARS",
            "SLURM_LAUNCHER_VARS",
            "SLURM_LOCAL_RANK_VARS",
            "SLURM_LOCAL_SIZE_VARS",
            "SLURM_STEP_VAR",
            "Snapshot",
            "in_slurm_step",
            "slurm_tasks_on_node",
        ),
        "snapshot",
    ),
}


def __getattr__(name: str) -> Any:
    """Serve a snapshot-side name (:data:`_LAZY`) from its module, imported now, once."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily served ones included."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DEVICE_ID_VAR",
    "ENTRY_POINT_GROUP",
    "LAUNCHER_VARS",
    "LOCAL_RANK_VARS",
    "LOCAL_SIZE_VARS",
    "RESERVED",
    "SELF",
    "SLURM_LAUNCHER_VARS",
    "SLURM_LOCAL_RANK_VARS",
    "SLURM_LOCAL_SIZE_VARS",
    "SLURM_STEP_VAR",
    "Backend",
    "Plugin",
    "ProbeTimeout",
    "Probed",
    "Snapshot",
    "after_build",
    "call_with_timeout",
    "configure",
    "get",
    "if_current",
    "in_slurm_step",
    "on_reset",
    "parse_visible",
    "refresh",
    "register",
    "reset",
    "settings",
    "slurm_tasks_on_node",
    "unregister",
]

#: Guards the published state below; held only briefly, never while plugin code runs.
_lock = threading.RLock()
#: Held by the thread building the shared snapshot (plugin code runs then).
_building = threading.Lock()
#: Counts drops: a snapshot whose build began before a drop is not published.
_generation = 0
_snapshot: Snapshot | None = None
_explicit: dict[str, Any] = {}
_registered: dict[str, Any] = {}
_listeners: list[Callable[[], None]] = []
#: Work handed over by code that ran inside plugin code (see :func:`after_build`).
_deferred: list[Callable[[], None]] = []


def get() -> Snapshot:
    """The current snapshot, built on first use.

    Refused (a failure of the calling plugin) when plugin code that accelreg is running asks.
    """
    snap = _snapshot
    if snap is not None:
        check_not_inside_plugin()
        if _deferred:
            _run_deferred()
        return snap
    return _build()


def after_build(callback: Callable[[], None]) -> None:
    """Run ``callback`` once accelreg has finished running plugin code: right after the snapshot
    being built is published, in the thread that built it (or at the next query, for plugin
    code run by a later probe).

    For code that runs *inside* plugin code without being part of it and needs the registry: an
    integration whose library a vendor's plugin imports at module level is enabled by that
    import, while the registry is loading the plugin, where asking the registry is refused.
    ``callback`` must not raise (what it raises is logged and dropped)."""
    with _lock:
        _deferred.append(callback)


def _run_deferred() -> None:
    while True:
        with _lock:
            if not _deferred:
                return
            callbacks = list(_deferred)
            _deferred.clear()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logging.getLogger("accelreg.registry").exception("accelreg: deferred work failed")


def _build() -> Snapshot:
    """Build the snapshot and publish it, unless a drop came in between or a plugin's module was
    still being imported (then the caller still gets the one it built, consistent in itself).

    One thread builds at a time; the others wait for it and take its snapshot. A thread inside
    an import never waits (the builder's plugin imports might be waiting for this thread's
    import lock): when another thread is building, it builds a snapshot of its own, used for
    its query and not published (see docs/design-notes.md, "The start-up hook never waits for
    an import").
    """
    global _snapshot
    check_not_inside_plugin()
    from .snapshot import Snapshot  # the plugin machinery, imported before any lock is taken

    shared = acquire(_building)
    try:
        with _lock:
            if _snapshot is not None:
                return _snapshot
            explicit, registered, generation = dict(_explicit), dict(_registered), _generation
        snap = Snapshot(explicit, registered)
        if shared and not snap.provisional:
            with _lock:
                if _snapshot is None and generation == _generation:
                    _snapshot = snap
    finally:
        if shared:
            _building.release()
    if _deferred:
        _run_deferred()
    return snap


def settings() -> Settings:
    """The effective settings (:class:`~accelreg.config.Settings`) without loading a plugin:
    the snapshot's when one is built, else read now from the same sources. Cheap enough for
    code that runs inside an import (``install()`` reads strict mode this way)."""
    snap = _snapshot
    if snap is not None:
        return snap.settings
    with _lock:
        explicit = dict(_explicit)
    return load_settings(explicit)


def on_reset(callback: Callable[[], None]) -> None:
    """Call ``callback`` (under the registry's lock) whenever the snapshot is dropped — by
    :func:`reset`, :func:`configure`, :func:`register`, :func:`unregister` — and in a forked
    child: a cache of answers subscribes here (:mod:`accelreg.resolution` does)."""
    with _lock:
        if callback not in _listeners:
            _listeners.append(callback)


def if_current(snap: Snapshot, action: Callable[[], None]) -> bool:
    """Run ``action`` under the registry's lock if ``snap`` is still the current snapshot;
    returns whether it ran. A cache publishes answers computed from ``snap`` this way, so a
    reset in between can never leave a stale answer published."""
    with _lock:
        if _snapshot is not snap:
            return False
        action()
        return True


def _drop() -> None:
    global _snapshot, _generation
    with _lock:
        _snapshot = None
        _generation += 1
        for callback in _listeners:
            callback()


def reset() -> None:
    """Forget everything: settings from :func:`configure`, registered plugins, probe results,
    and which warnings were already given.

    The next query rebuilds from the environment, configuration files and entry points. Call
    it after changing ``ACCELREG_*`` variables, ``LOCAL_RANK`` or visible-device masks
    in-process.
    """
    with _lock:
        _explicit.clear()
        _registered.clear()
        _warn.forget()
        _drop()


def refresh() -> None:
    """Re-read the environment at the next query, keeping :func:`configure` settings and
    plugins added with :func:`register` (unlike :func:`reset`).

    For code that changes a visible-devices mask, ``LOCAL_RANK`` or ``ACCELREG_DEVICE_ID`` in a
    process that goes on running: a scheduler's worker reused for the next task (accelreg's
    Ray integration calls it whenever Ray sets or restores a task's mask). Cheap: the snapshot
    is rebuilt only when something asks.
    """
    _drop()


def configure(**settings: Any) -> None:
    """Set configuration explicitly (the highest-precedence source); ``None`` leaves a key as is.

    Keys: ``priority``, ``disable``, ``plugins``, ``disable_plugin_autoload``, ``strict``,
    ``providers``, ``probe_timeout``, ``cpu_fallback`` (see :mod:`accelreg.config`). Values are
    validated now: a bad one raises :class:`~accelreg.errors.ConfigError` and changes nothing.
    """
    with _lock:
        merged = dict(_explicit)
        merged.update({k: v for k, v in settings.items() if v is not None})
        check_explicit(merged)  # validate before publishing anything
        _explicit.clear()
        _explicit.update(merged)
        _drop()


def register(plugin: Any, name: str | None = None) -> str:
    """Register a plugin object in-process (as an external plugin); returns its name.

    Useful for tests and for frameworks that ship a backend without an entry point. The
    registration lasts until :func:`unregister` or :func:`reset`.
    """
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    with _lock:
        if name in _registered:
            raise PluginError(f"a plugin named {name!r} is already registered")
        _registered[name] = plugin
        _drop()
    return name


def unregister(name: str) -> None:
    """Remove a plugin registered with :func:`register`."""
    with _lock:
        if _registered.pop(name, None) is None:
            raise PluginError(f"no plugin named {name!r} is registered")
        _drop()


def _after_fork_in_child() -> None:
    """Keep the parent's registry usable in a forked child without touching a device runtime.

    Plugins and probe answers (availability, counts) describe the machine and stay valid; a
    child re-probing a runtime the parent initialised (CUDA after fork) could fail or hang. What
    is per-process is dropped: resolve()'s cache (it holds current-device answers) and every
    lock, which another thread of the parent may have held at the moment of the fork.
    """
    global _lock, _building
    _lock = threading.RLock()
    _building = threading.Lock()
    runner.after_fork()
    snap = _snapshot
    if snap is not None:
        snap.after_fork()
    for callback in _listeners:
        callback()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
