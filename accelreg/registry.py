"""The registry: plugin loading, backend selection, probe caching, ``reset()``.

Nothing here runs at ``import accelreg``. The first query builds a :class:`Snapshot` — the
settings, the loaded plugins and the selected backends in effective order — and every later
query reads that snapshot until :func:`reset` (or :func:`accelreg.configure`) drops it. A
snapshot is never mutated once published, except for its lazily filled probe results, which
are computed under a per-backend lock, so concurrent readers see one configuration or the
next, never half of each.

Plugins are contained: a plugin that fails to import, or whose hook or probe raises, hangs or
answers nonsense, is recorded as a :class:`~accelreg.types.PluginFailure` and skipped (in
strict mode the failure raises :class:`~accelreg.errors.PluginError` instead).
"""

from __future__ import annotations

import importlib
import os
import queue
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any, NamedTuple

from . import entrypoints, resolution
from .config import NAME_RE, Settings, check_explicit, load_settings
from .errors import ConfigError, DeviceError, PluginConflictError, PluginError
from .types import Availability, BackendInfo, BackendSpec, MemoryInfo, PlacementRule, PluginFailure

__all__ = ["ENTRY_POINT_GROUP", "Backend", "Snapshot", "get", "register", "reset", "unregister"]

ENTRY_POINT_GROUP = "accelreg"
SELF = "accelreg"
#: Names a backend may not take: they mean something else in a device map.
RESERVED = frozenset({"auto", "disk", "meta", "balanced", "balanced_low_0", "sequential"})
_MAX_COUNT = 1 << 16


class ProbeTimeout(Exception):
    """A probe did not answer within ``probe_timeout`` seconds."""


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


class _Runner:
    """One daemon thread that runs probes, replaced when a probe overstays its timeout.

    A stuck driver call cannot be killed, but it must not hang the caller: the worker is
    abandoned (it is a daemon, so it never keeps the process alive) and a fresh one serves
    the next probe. Reusing one thread keeps the first ``resolve()`` cheap.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Any] | None = None
        self._pid = 0
        self._ident: int | None = None

    def _start(self) -> queue.SimpleQueue[Any]:
        jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        worker = threading.Thread(target=self._serve, args=(jobs,), name="accelreg-probe", daemon=True)
        worker.start()
        self._jobs, self._pid, self._ident = jobs, os.getpid(), worker.ident
        return jobs

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while True:
            fn, args, box, done = jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - everything a plugin raises is contained
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
        if threading.get_ident() == self._ident and os.getpid() == self._pid:
            return fn(*args)  # a probe that queries accelreg: run inline, never wait on itself
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        with self._lock:
            jobs = self._jobs if self._jobs is not None and self._pid == os.getpid() else self._start()
            jobs.put((fn, args, box, done))
            if not done.wait(timeout):
                self._jobs = None  # abandon the stuck worker
                raise ProbeTimeout(f"no answer within {timeout:g} s (probe_timeout)")
        ok, value = box[0]
        if ok:
            return value
        raise value


_runner = _Runner()


def call_with_timeout(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    """Run ``fn(*args)`` on the probe thread; raise :class:`ProbeTimeout` past ``timeout``."""
    return _runner.call(fn, args, timeout)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ProbeTimeout):
        return f"timed out: {exc}"
    return f"{type(exc).__name__}: {exc}"


class Plugin(NamedTuple):
    """A loaded plugin object and where it came from."""

    name: str
    obj: Any
    distribution: str
    version: str
    builtin: bool


class Probed(NamedTuple):
    """What one backend's probes said, computed once per snapshot."""

    availability: Availability
    count: int
    visible: tuple[str, ...] | None
    visible_error: str | None


class Backend:
    """A selected backend: its spec, its provider and its lazily probed state."""

    def __init__(
        self,
        spec: BackendSpec,
        plugin: Plugin,
        snapshot: Snapshot,
        *,
        replaces: str | None = None,
        blocked: str | None = None,
    ) -> None:
        self.spec = spec
        self.plugin = plugin
        self.replaces = replaces
        self.blocked = blocked
        self.position = -1
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._probed: Probed | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device_type(self) -> str:
        return self.spec.torch_type

    # -- probes ---------------------------------------------------------------------------
    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one of this backend's probes, contained and under the probe timeout."""
        try:
            return call_with_timeout(fn, args, self._snapshot.settings.probe_timeout)
        except Exception as exc:
            failure = self._snapshot.fail(self.plugin, f"probe {what} of {self.name!r}", exc)
            raise _ProbeFailed(failure) from exc

    def probe(self) -> Probed:
        """Availability, device count and visible devices, probed once."""
        probed = self._probed
        if probed is None:
            with self._lock:
                probed = self._probed
                if probed is None:
                    probed = self._probed = self._probe()
        return probed

    def _probe(self) -> Probed:
        visible, visible_error = self._visible()
        if self.blocked is not None:
            return Probed(Availability.no(self.blocked), 0, visible, visible_error)
        try:
            availability = _availability(self.call("is_available", self.spec.is_available))
            count = 0
            if availability.available:
                count = _count(self.call("device_count", self.spec.device_count))
                if count == 0:
                    availability = Availability.no(f"{self.name} reports no devices")
        except _ProbeFailed as failed:
            return Probed(Availability.no(f"probe raised: {failed.failure.error}"), 0, visible, visible_error)
        except _Nonsense as exc:
            failure = self._snapshot.fail(self.plugin, f"probe of {self.name!r}", exc)
            return Probed(
                Availability.no(f"probe answered nonsense: {failure.error}"), 0, visible, visible_error
            )
        return Probed(availability, count, visible, visible_error)

    def _visible(self) -> tuple[tuple[str, ...] | None, str | None]:
        var = self.spec.visible_devices_var
        value = self._snapshot.environ.get(var) if var else None
        if value is None:
            return None, None
        if self.spec.parse_visible_devices is None:
            return parse_visible(self.spec, value)
        # A plugin's own parser is a probe like any other: contained, timed, recorded.
        try:
            ids, problem = self.call("parse_visible_devices", parse_visible, self.spec, value)
        except _ProbeFailed as failed:
            return None, f"parser failed: {failed.failure.error}"
        if problem is not None and problem.startswith("parser returned"):
            self._snapshot.fail(
                self.plugin, f"probe parse_visible_devices of {self.name!r}", _Nonsense(problem)
            )
        return ids, problem

    @property
    def available(self) -> bool:
        return self.probe().availability.available

    @property
    def count(self) -> int:
        return self.probe().count

    def current_index(self) -> int:
        """The runtime's current device index (0 when the plugin gives no probe)."""
        fn = self.spec.current_index
        if fn is None:
            return 0
        try:
            index = self.call("current_index", fn)
        except _ProbeFailed as failed:
            raise DeviceError(
                f"{self.name}: cannot read the current device: {failed.failure.error}"
            ) from None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < max(self.count, 1):
            problem = f"current_index returned {index!r}, not an index below {self.count}"
            self._snapshot.fail(self.plugin, f"probe current_index of {self.name!r}", _Nonsense(problem))
            raise DeviceError(f"{self.name}: {problem}")
        return index

    def device(self, index: int) -> Any:
        """The torch device for a validated ``index`` (the plugin may override the mapping)."""
        import torch

        fn = self.spec.device
        if fn is None:
            try:
                return (
                    torch.device(self.device_type, index)
                    if self.spec.indexed
                    else torch.device(self.device_type)
                )
            except RuntimeError as exc:
                raise DeviceError(
                    f"{self.name}: torch does not know device type {self.device_type!r} although the "
                    f"backend reports devices (has its runtime registered the device type?): {exc}"
                ) from None
        try:
            dev = self.call("device", fn, index)
        except _ProbeFailed as failed:
            raise DeviceError(
                f"{self.name}: cannot map index {index} to a device: {failed.failure.error}"
            ) from None
        if not isinstance(dev, torch.device) or dev.type != self.device_type:
            problem = f"device({index}) returned {dev!r}, not a {self.device_type} device"
            self._snapshot.fail(self.plugin, f"probe device of {self.name!r}", _Nonsense(problem))
            raise DeviceError(f"{self.name}: {problem}")
        return dev

    def memory(self, index: int) -> MemoryInfo | None:
        """Free/total bytes of device ``index`` right now, or ``None`` if unknown."""
        fn = self.spec.memory_info
        if fn is None or not self.available:
            return None
        try:
            info = self.call("memory_info", fn, index)
        except _ProbeFailed:
            return None
        if info is None:
            return None
        if (
            not isinstance(info, MemoryInfo)
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (info.free, info.total))
            or info.free > info.total
        ):
            self._snapshot.fail(
                self.plugin, f"probe memory_info of {self.name!r}", _Nonsense(f"returned {info!r}")
            )
            return None
        return info

    def info(self) -> BackendInfo:
        probed = self.probe()
        return BackendInfo(
            name=self.name,
            device_type=self.device_type,
            priority=self.spec.priority,
            position=self.position,
            available=probed.availability.available,
            reason=probed.availability.reason,
            device_count=probed.count,
            provider=self.plugin.distribution,
            provider_version=self.plugin.version,
            builtin=self.plugin.builtin,
            replaces=self.replaces,
            visible_devices_var=self.spec.visible_devices_var,
            visible_devices=probed.visible,
            indexed=self.spec.indexed,
            plugin=self.plugin.name,
        )


class _ProbeFailed(Exception):
    def __init__(self, failure: PluginFailure) -> None:
        super().__init__(failure.error)
        self.failure = failure


class _Nonsense(Exception):
    """A probe returned a value of the wrong type or range."""


def _availability(value: Any) -> Availability:
    if isinstance(value, Availability):
        if isinstance(value.available, bool) and isinstance(value.reason, str):
            return value
    elif isinstance(value, bool):
        return Availability(value, "available" if value else "unavailable (the plugin gave no reason)")
    elif (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], bool)
        and isinstance(value[1], str)
    ):
        return Availability(value[0], value[1])
    raise _Nonsense(f"is_available returned {value!r}, not an Availability, bool or (bool, str)")


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT:
        raise _Nonsense(f"device_count returned {value!r}, not a non-negative int")
    return value


def parse_visible(spec: BackendSpec, value: str) -> tuple[tuple[str, ...] | None, str | None]:
    """``(physical ids, None)`` for a value of ``spec``'s visible-devices variable, or
    ``(None, problem)`` when the value is invalid or the parser answers nonsense. Any other
    exception of a plugin's parser propagates (callers run it as a contained probe)."""
    parse = spec.parse_visible_devices
    if parse is None:
        from .visible import parse_visible_devices

        var = spec.visible_devices_var or "visible devices"

        def parse(v: str) -> tuple[str, ...]:
            return parse_visible_devices(v, var=var)

    try:
        ids = parse(value)
    except ValueError as exc:  # a value the runtime would not accept: the user's problem
        return None, str(exc)
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids):
        return None, f"parser returned {ids!r}, not a sequence of str"
    return tuple(ids), None


class Snapshot:
    """One consistent view of settings, plugins and backends."""

    def __init__(
        self,
        explicit: Mapping[str, Any],
        registered: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.environ: Mapping[str, str] = dict(os.environ if environ is None else environ)
        self.settings: Settings = load_settings(explicit, self.environ)
        self.failures: list[PluginFailure] = []
        self.skipped: list[tuple[str, str, str]] = []  # (plugin, distribution, why)
        self.warnings: list[str] = list(self.settings.warnings) + list(self.settings.errors)
        self.conflicts: dict[str, str] = {}
        #: Resolved answers, ``spec -> (type(spec), device)``; read by ``resolve``'s hot path.
        self.cache: dict[Any, tuple[type, Any]] = {}
        self._fail_lock = threading.Lock()
        self._rules: dict[str, tuple[tuple[Plugin, PlacementRule], ...]] = {}
        self._rules_lock = threading.Lock()
        self._current: Backend | None = None
        self.plugins = self._load_plugins(registered)
        self.pm = self._manager()
        self.order: tuple[Backend, ...] = self._select()
        self.by_name: dict[str, Backend] = {b.name: b for b in self.order}
        self.local_rank = _local_rank(self.environ)
        for problem in self.settings.errors:
            warnings.warn(f"accelreg: configuration file skipped: {problem}", RuntimeWarning, stacklevel=4)

    # -- failures -------------------------------------------------------------------------
    def fail(self, plugin: Plugin, stage: str, exc: BaseException) -> PluginFailure:
        failure = PluginFailure(plugin.name, plugin.distribution, plugin.version, stage, _describe(exc))
        with self._fail_lock:
            if failure not in self.failures:
                self.failures.append(failure)
        if self.settings.strict:
            raise PluginError(f"{failure} (ACCELREG_STRICT is set)") from exc
        return failure

    # -- loading --------------------------------------------------------------------------
    def _load_plugins(self, registered: Mapping[str, Any]) -> list[Plugin]:
        s = self.settings
        disabled = set(s.disable)
        plugins: list[Plugin] = []
        try:
            eps = entrypoints.find(ENTRY_POINT_GROUP)
        except Exception as exc:  # noqa: BLE001 - a corrupt dist-info must not break resolve
            self.fail(Plugin("<entry points>", None, "", "", False), "entry-point scan", exc)
            eps = []
        have_builtins = False
        for ep in eps:
            dist_name, version = ep.distribution, ep.version
            builtin = _norm(dist_name or "") == SELF
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
                self.skipped.append((ep.name, dist_name, why))
                continue
            stub = Plugin(ep.name, None, dist_name, version, builtin)
            try:
                obj = call_with_timeout(ep.load, (), s.probe_timeout)
            except Exception as exc:  # noqa: BLE001 - contained and recorded
                self.fail(stub, "import", exc)
                continue
            plugins.append(Plugin(ep.name, obj, dist_name, version, builtin))
        if not have_builtins:
            # Running from a source tree that was never installed: no entry points exist.
            from .builtin import BUILTIN_MODULES

            for name, module in BUILTIN_MODULES.items():
                plugins.append(Plugin(name, importlib.import_module(module), SELF, _self_version(), True))
        for name, obj in registered.items():
            if name in disabled:
                self.skipped.append((name, "<registered>", "disabled by configuration"))
                continue
            plugins.append(Plugin(name, obj, "<registered>", "", False))
        return plugins

    def _manager(self) -> Any:
        """A pluggy manager holding every loaded plugin; a plugin it rejects is a failure."""
        import pluggy

        from . import hookspecs

        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        kept: list[Plugin] = []
        for plugin in self.plugins:
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
                    raise PluginError(f"implements unknown hook(s) {', '.join(unknown)}")
            except Exception as exc:  # pluggy.PluginValidationError, ValueError, PluginError
                if isinstance(exc, PluginError) and self.settings.strict:
                    raise
                self.fail(plugin, "register", exc)
                continue
            kept.append(plugin)
        self.plugins = kept
        return pm

    def _impls(self, hook: str) -> Iterable[tuple[Plugin, Callable[..., Any]]]:
        """Each plugin's implementation of ``hook``, so each can be called and contained alone."""
        owners = {id(p.obj): p for p in self.plugins}
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            plugin = owners.get(id(impl.plugin))
            if plugin is not None:
                yield plugin, impl.function

    def _specs(self) -> list[tuple[Plugin, BackendSpec]]:
        found: list[tuple[Plugin, BackendSpec]] = []
        for plugin, fn in self._impls("accelreg_backends"):
            try:
                specs = call_with_timeout(lambda f=fn: list(f() or ()), (), self.settings.probe_timeout)
            except Exception as exc:  # noqa: BLE001 - contained and recorded
                self.fail(plugin, "accelreg_backends", exc)
                continue
            for spec in specs:
                problem = _spec_problem(spec)
                if problem:
                    self.fail(plugin, "accelreg_backends", _Nonsense(problem))
                    continue
                found.append((plugin, spec))
        return found

    # -- selection ------------------------------------------------------------------------
    def _select(self) -> tuple[Backend, ...]:
        s = self.settings
        by_name: dict[str, list[tuple[Plugin, BackendSpec]]] = {}
        for plugin, spec in self._specs():
            by_name.setdefault(spec.name, []).append((plugin, spec))
        chosen: list[Backend] = []
        for name, offers in by_name.items():
            backend = self._choose(name, offers)
            if backend is not None:
                chosen.append(backend)
        if not any(b.name == "cpu" for b in chosen):
            raise PluginError("no cpu backend is registered; accelreg's own installation is broken")
        known = {b.name for b in chosen}
        for name in s.priority:
            if name not in known and name != "cpu":
                msg = (
                    f"priority ({s.sources.get('priority')}) names {name!r}, which no installed plugin "
                    f"provides; known backends: {', '.join(sorted(known))}"
                )
                if s.strict:
                    raise ConfigError(msg + " (ACCELREG_STRICT is set)")
                self.warnings.append(msg)
                warnings.warn(f"accelreg: {msg}", RuntimeWarning, stacklevel=5)
        rank = {name: i for i, name in enumerate(s.priority)}
        chosen.sort(
            key=lambda b: (
                b.name == "cpu",
                rank.get(b.name, len(rank)),
                -b.spec.priority,
                b.name,
            )
        )
        for i, backend in enumerate(chosen):
            backend.position = i
        return tuple(chosen)

    def _choose(self, name: str, offers: list[tuple[Plugin, BackendSpec]]) -> Backend | None:
        s = self.settings
        blocked = None
        if name in s.disable:
            blocked = f"disabled by {s.sources.get('disable')}"
        builtins = [o for o in offers if o[0].builtin]
        externals = [o for o in offers if not o[0].builtin]
        wanted = s.providers.get(name)
        if wanted is not None:
            picked = [o for o in offers if _norm(o[0].distribution) == _norm(wanted)]
            if not picked:
                dists = ", ".join(sorted({o[0].distribution for o in offers}))
                msg = (
                    f"providers ({s.sources.get('providers')}) picks {wanted!r} for {name!r}, "
                    f"but {name!r} is provided by: {dists}"
                )
                return self._conflict(name, offers, msg)
            externals = [o for o in picked if not o[0].builtin]
            builtins = [o for o in picked if o[0].builtin]
        if len(externals) > 1:
            dists = " and ".join(f"{o[0].distribution} {o[0].version}".strip() for o in externals)
            msg = (
                f"backend {name!r} is registered by both {dists}; choose one with "
                f'providers = {{{name} = "<distribution>"}} or ACCELREG_PROVIDERS={name}=<distribution>'
            )
            return self._conflict(name, offers, msg)
        if externals:
            plugin, spec = externals[0]
            replaces = f"{builtins[0][0].distribution} {builtins[0][0].version}".strip() if builtins else None
            return Backend(spec, plugin, self, replaces=replaces, blocked=blocked)
        plugin, spec = builtins[0]
        return Backend(spec, plugin, self, blocked=blocked)

    def _conflict(self, name: str, offers: list[tuple[Plugin, BackendSpec]], msg: str) -> Backend:
        if self.settings.strict:
            raise PluginConflictError(msg + " (ACCELREG_STRICT is set)")
        self.conflicts[name] = msg
        self.warnings.append(msg)
        plugin, spec = offers[0]
        return Backend(spec, plugin, self, blocked=f"conflict: {msg}")

    def after_fork(self) -> None:
        """Fresh locks and an empty answer cache in a forked child (see registry docs)."""
        self._fail_lock = threading.Lock()
        self._rules_lock = threading.Lock()
        self.cache = {}
        for backend in self.order:
            backend._lock = threading.Lock()

    # -- queries --------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        """The backend called ``name``, or a :class:`DeviceError` naming the known ones."""
        try:
            return self.by_name[name]
        except KeyError:
            raise DeviceError(
                f"unknown backend {name!r}; registered backends: {', '.join(self.by_name)}; "
                f"available: {self.available_summary()}"
            ) from None

    def current(self) -> Backend:
        """The first available backend in effective order (cpu when nothing else is)."""
        current = self._current
        if current is None:
            current = next(b for b in self.order if b.name == "cpu" or b.available)
            self._current = current
        return current

    def available_summary(self) -> str:
        """``"npu:0, npu:1, cpu"``: every device available here, for error messages."""
        devices: list[str] = []
        for b in self.order:
            if b.name != "cpu" and b.available:
                devices.extend(b.info().devices())
        devices.append("cpu")
        return ", ".join(devices)

    def rules(self, backend: str) -> tuple[tuple[Plugin, PlacementRule], ...]:
        """Every placement rule any plugin yields for ``backend`` (cached per snapshot)."""
        cached = self._rules.get(backend)
        if cached is not None:
            return cached
        with self._rules_lock:
            cached = self._rules.get(backend)
            if cached is None:
                found: list[tuple[Plugin, PlacementRule]] = []
                for plugin, fn in self._impls("accelreg_placement_rules"):
                    try:
                        rules = call_with_timeout(
                            lambda f=fn: list(f(backend=backend) or ()), (), self.settings.probe_timeout
                        )
                    except Exception as exc:  # noqa: BLE001 - contained and recorded
                        self.fail(plugin, "accelreg_placement_rules", exc)
                        continue
                    for rule in rules:
                        if not isinstance(rule, PlacementRule):
                            self.fail(
                                plugin,
                                "accelreg_placement_rules",
                                _Nonsense(f"yielded {rule!r}, not a PlacementRule"),
                            )
                            continue
                        found.append((plugin, rule))
                cached = self._rules[backend] = tuple(found)
        return cached


def _spec_problem(spec: Any) -> str | None:
    if not isinstance(spec, BackendSpec):
        return f"yielded {spec!r}, not a BackendSpec"
    if not isinstance(spec.name, str) or not NAME_RE.fullmatch(spec.name):
        return f"backend name {spec.name!r} is not lower case [a-z0-9_], starting with a letter"
    if spec.name in RESERVED:
        return f"backend name {spec.name!r} is reserved"
    if spec.device_type is not None and (
        not isinstance(spec.device_type, str) or not NAME_RE.fullmatch(spec.device_type)
    ):
        return f"device_type {spec.device_type!r} of {spec.name!r} is not a valid torch device type"
    if isinstance(spec.priority, bool) or not isinstance(spec.priority, int):
        return f"priority of {spec.name!r} must be an int, got {spec.priority!r}"
    for field_name in ("is_available", "device_count"):
        if not callable(getattr(spec, field_name)):
            return f"{field_name} of {spec.name!r} is not callable"
    for field_name in ("current_index", "device", "memory_info", "parse_visible_devices"):
        value = getattr(spec, field_name)
        if value is not None and not callable(value):
            return f"{field_name} of {spec.name!r} is not callable"
    return None


#: Variables launchers set to tell a process its rank on the node, in order of trust.
LOCAL_RANK_VARS = (
    "LOCAL_RANK",  # torchrun, the DeepSpeed launcher, accelerate launch
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI (deepspeed --launcher openmpi)
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH2
    "MPI_LOCALRANKID",  # Intel MPI / MPICH hydra
)


def _local_rank(environ: Mapping[str, str]) -> tuple[str, str] | None:
    for var in LOCAL_RANK_VARS:
        value = environ.get(var)
        if value is not None and value.strip() != "":
            return var, value
    return None


def _self_version() -> str:
    try:
        return metadata.version(SELF)
    except metadata.PackageNotFoundError:
        return "(not installed)"


# -- the process-wide registry -----------------------------------------------------------
_lock = threading.RLock()
_snapshot: Snapshot | None = None
_explicit: dict[str, Any] = {}
_registered: dict[str, Any] = {}
_listeners: list[Callable[[], None]] = []


def get() -> Snapshot:
    """The current snapshot, built on first use."""
    snap = _snapshot
    if snap is not None:
        return snap
    return _build()


def _build() -> Snapshot:
    global _snapshot
    with _lock:
        if _snapshot is None:
            _snapshot = Snapshot(dict(_explicit), dict(_registered))
        return _snapshot


def on_reset(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever the snapshot is dropped (used by resolve's cache)."""
    _listeners.append(callback)


def _drop() -> None:
    global _snapshot
    with _lock:
        _snapshot = None
        resolution._drop_cache()
        for callback in _listeners:
            callback()


def reset() -> None:
    """Forget everything: settings from :func:`configure`, registered plugins, probe results.

    The next query rebuilds from the environment, configuration files and entry points. Call
    it after changing ``ACCELREG_*`` variables, ``LOCAL_RANK`` or visible-device masks
    in-process.
    """
    with _lock:
        _explicit.clear()
        _registered.clear()
        _drop()


def configure(**settings: Any) -> None:
    """Set configuration explicitly (the highest-precedence source); ``None`` leaves a key as is.

    Keys: ``priority``, ``disable``, ``plugins``, ``disable_plugin_autoload``, ``strict``,
    ``providers``, ``probe_timeout`` (see :mod:`accelreg.config`). Values are validated now: a bad
    one raises :class:`~accelreg.errors.ConfigError` and changes nothing.
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
    global _lock
    _lock = threading.RLock()
    _runner._lock = threading.Lock()
    _runner._jobs = None  # the probe thread did not survive the fork
    snap = _snapshot
    if snap is not None:
        snap.after_fork()
    resolution._drop_cache()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
