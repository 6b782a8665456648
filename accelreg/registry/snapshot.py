"""Snapshot and selection: one consistent view of settings, plugins and backends.

A :class:`Snapshot` is built on the first query: it reads the settings, loads the plugins
(:mod:`.loading`), keeps its own validated copy of every spec they yield, picks one provider
per backend name and orders the backends. It is never mutated once published, except for its
lazily filled probe results (computed under a per-backend lock), its answer cache and its
failure and warning records.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from .. import _warn, flags
from ..config import Settings, load_settings
from ..entrypoints import norm
from ..errors import ConfigError, DeviceError, PluginConflictError, PluginError
from ..types import BackendSpec, PlacementRule, PluginFailure
from .containment import CONTAINED, Nonsense, acquire, describe, safe_str
from .loading import Plugin, call_hook, load
from .probing import Backend
from .records import own_rule, own_spec

__all__ = [
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
]

#: Variables launchers set to tell a process its rank on the node, in order of trust.
LOCAL_RANK_VARS = (
    "LOCAL_RANK",  # torchrun, the DeepSpeed launcher, accelerate launch
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI (deepspeed --launcher openmpi)
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH2
    "MPI_LOCALRANKID",  # Intel MPI / MPICH hydra
)
#: How many processes a launcher started on this node (each an upper bound of a local rank).
LOCAL_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",  # torchrun, accelerate launch
    "LOCAL_SIZE",  # the DeepSpeed launcher
    "OMPI_COMM_WORLD_LOCAL_SIZE",  # Open MPI
    "MV2_COMM_WORLD_LOCAL_SIZE",  # MVAPICH2
    "MPI_LOCALNRANKS",  # Intel MPI / MPICH hydra
)
#: Set by a scheduler that gives a process devices of its own (accelreg's Ray integration, for
#: each task and actor given devices): ``<backend>=<physical id>``, the device ``resolve()``
#: picks — the entry of the backend's visible-devices mask, whichever position it has there.
#: It takes precedence over a local rank (a Ray Train worker's ``LOCAL_RANK`` counts workers on
#: the node, not the devices its own mask shows).
DEVICE_ID_VAR = "ACCELREG_DEVICE_ID"
_RUN_VAR = "ACCELREG_RUN"
#: How many of the names a setting gives that no plugin provides its one warning shows (each with
#: a "did you mean"); the rest are counted.
_UNKNOWN_SHOWN = 5
#: Any of these set means a launcher started this process as part of a job (``ACCELREG_RUN``:
#: ``accelreg run``, for every process of its command, when it holds an on word;
#: ``ACCELREG_DEVICE_ID``: a scheduler gave it devices).
LAUNCHER_VARS = (
    *LOCAL_RANK_VARS,
    "RANK",
    "WORLD_SIZE",
    *LOCAL_SIZE_VARS,
    _RUN_VAR,
    DEVICE_ID_VAR,
)
#: Slurm sets it in every task of a job step (``srun``, also inside ``sbatch``), and not in a batch
#: script's own shell, which is no rank: Slurm's task variables count only where it is set.
SLURM_STEP_VAR = "SLURM_STEP_ID"
#: A Slurm task's rank on its node (inside a step): a local rank, after the launchers' own.
SLURM_LOCAL_RANK_VARS = ("SLURM_LOCALID",)
#: Slurm's task counts that bound a Slurm local rank, after the step's tasks on this node
#: (``SLURM_STEP_TASKS_PER_NODE`` at ``SLURM_NODEID``, see :func:`slurm_tasks_on_node`).
SLURM_LOCAL_SIZE_VARS = ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
#: Any of these set inside a step means Slurm started this process as a task of a job.
SLURM_LAUNCHER_VARS = ("SLURM_LOCALID", "SLURM_PROCID")
_TASKS_PER_NODE = re.compile(r"([0-9]{1,9})(?:\(x([0-9]{1,9})\))?")
#: Failure stages after which an external plugin's backend is missing although it is installed.
_LOAD_STAGES = ("import", "register", "accelreg_backends")


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for var in names:
        value = environ.get(var)
        if value is not None and value.strip() != "":
            return var, value
    return None


def _launcher(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The first launcher variable that is set; ``ACCELREG_RUN`` only with an on word
    (:mod:`accelreg.flags`): ``ACCELREG_RUN=0`` says this process is not part of a job."""
    for var in LAUNCHER_VARS:
        found = _first_set(environ, (var,))
        if found is not None and (var != _RUN_VAR or flags.parse(found[1])):
            return found
    return None


def _local_rank(environ: Mapping[str, str]) -> tuple[str, str] | None:
    found = _first_set(environ, LOCAL_RANK_VARS)
    if found is None and in_slurm_step(environ):
        found = _first_set(environ, SLURM_LOCAL_RANK_VARS)
    return found


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of a Slurm job step (``SLURM_STEP_ID`` set): the only
    place where Slurm's task variables (``SLURM_LOCALID``, ``SLURM_PROCID``) name a rank."""
    return bool((environ.get(SLURM_STEP_VAR) or "").strip())


def slurm_tasks_on_node(environ: Mapping[str, str]) -> int | None:
    """How many tasks of this Slurm step run on this node: entry ``SLURM_NODEID`` of
    ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``: 2 on nodes 0-2, 1 on node 3); ``None`` outside
    a step or when the variables are missing or malformed."""
    if not in_slurm_step(environ):
        return None
    node, layout = (environ.get(v, "").strip() for v in ("SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE"))
    if not node.isdecimal() or not layout:
        return None
    index = int(node)
    for part in layout.split(","):
        m = _TASKS_PER_NODE.fullmatch(part.strip())
        if m is None:
            return None
        repeat = int(m.group(2) or 1)
        if index < repeat:
            return int(m.group(1))
        index -= repeat
    return None


def _rank_bounds(
    environ: Mapping[str, str], local_rank: tuple[str, str] | None
) -> tuple[tuple[str, str], ...]:
    """The process counts that bound ``local_rank``, from the same launcher: Slurm's for a
    Slurm local rank (a torchrun started by ``srun -n1`` counts its own ranks), else the others."""
    if local_rank is not None and local_rank[0] in SLURM_LOCAL_RANK_VARS:
        on_node = slurm_tasks_on_node(environ)
        found = [("SLURM_STEP_TASKS_PER_NODE", str(on_node))] if on_node is not None else []
        names: tuple[str, ...] = SLURM_LOCAL_SIZE_VARS
    else:
        found, names = [], (*LOCAL_SIZE_VARS, "WORLD_SIZE")
    found += [(var, environ[var]) for var in names if (environ.get(var) or "").strip()]
    return tuple(found)


def _close(name: str, known: list[str]) -> str:
    """``" (did you mean 'npu'?)"`` for a near miss of a known backend name, else ``""``."""
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _distribution_installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return True


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
        self.warnings: list[str] = []
        self.conflicts: dict[str, str] = {}
        #: Resolved answers, ``spec -> (type(spec), device)``; read by ``resolve``'s hot path.
        self.cache: dict[Any, tuple[type, Any]] = {}
        self._fail_lock = threading.Lock()
        self._rules: dict[str, tuple[tuple[Plugin, PlacementRule], ...]] = {}
        self._rules_lock = threading.Lock()
        self._current: Backend | None = None
        self.local_rank = _local_rank(self.environ)
        #: ``(variable, value)`` of every process-count variable the launcher of that local rank
        #: set that bounds it (``LOCAL_WORLD_SIZE``, ..., ``WORLD_SIZE``; Slurm's task counts for
        #: ``SLURM_LOCALID``), in that order.
        self.rank_bounds = _rank_bounds(self.environ, self.local_rank)
        #: ``(variable, value)`` of ``ACCELREG_DEVICE_ID`` when it is set, or ``None``.
        self.device_id = _first_set(self.environ, (DEVICE_ID_VAR,))
        #: ``(variable, value)`` of the launcher variable that is set, or ``None``.
        self.launcher = _launcher(self.environ)
        if self.launcher is None and in_slurm_step(self.environ):
            self.launcher = _first_set(self.environ, SLURM_LAUNCHER_VARS)
        for problem in self.settings.errors:
            self.warn(f"configuration file skipped: {problem}", record=problem)
        for problem in self.settings.warnings:
            self.warn(problem)
        loaded = load(self.settings, registered)
        self.pm, self.plugins = loaded.pm, loaded.plugins
        #: ``(plugin, distribution, why)`` of plugins the settings kept out.
        self.skipped: list[tuple[str, str, str]] = loaded.skipped
        self._loaded = loaded
        #: Built while a plugin's module was still being imported: answers this query only
        #: (the registry does not keep it; the next query builds again).
        self.provisional = loaded.provisional
        for plugin, stage, exc in loaded.failures:
            self.fail(plugin, stage, exc)
        self.order: tuple[Backend, ...] = self._select()
        self.by_name: dict[str, Backend] = {b.name: b for b in self.order}

    # -- records --------------------------------------------------------------------------
    def fail(self, plugin: Plugin, stage: str, exc: BaseException) -> PluginFailure:
        """Record a contained plugin failure (raise :class:`PluginError` in strict mode)."""
        failure = PluginFailure(plugin.name, plugin.distribution, plugin.version, stage, describe(exc))
        with self._fail_lock:
            if failure not in self.failures:
                self.failures.append(failure)
        if self.settings.strict:
            raise PluginError(f"{failure} (ACCELREG_STRICT is set)") from exc
        return failure

    def warn(self, message: str, *, record: str | None = None, emit: bool = True) -> None:
        """Record ``message`` (or ``record``) for ``accelreg env``; with ``emit``, also issue it
        as a RuntimeWarning, once per process."""
        with self._fail_lock:
            text = message if record is None else record
            if text not in self.warnings:
                self.warnings.append(text)
        if emit:
            _warn.warn_once(message)

    # -- selection ------------------------------------------------------------------------
    def _specs(self) -> list[tuple[Plugin, BackendSpec]]:
        found: list[tuple[Plugin, BackendSpec]] = []
        for plugin, fn in self._loaded.implementations("accelreg_backends"):
            try:
                specs = call_hook(plugin, fn, self.settings.probe_timeout)
            except CONTAINED as exc:
                self.fail(plugin, "accelreg_backends", exc)
                continue
            for spec in specs:
                try:
                    found.append((plugin, own_spec(spec, plugin)))
                except Nonsense as exc:
                    self.fail(plugin, "accelreg_backends", exc)
        return found

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
        known = sorted(b.name for b in chosen)
        for key in ("priority", "providers"):
            self._unknown_names(key, [name for name in getattr(s, key) if name not in by_name], known)
        rank = {name: i for i, name in enumerate(s.priority)}
        chosen.sort(key=lambda b: (b.name == "cpu", rank.get(b.name, len(rank)), -b.spec.priority, b.name))
        for i, backend in enumerate(chosen):
            backend.position = i
        return tuple(chosen)

    def _unknown_names(self, key: str, names: list[str], known: list[str]) -> None:
        """One warning (an error in strict mode) for every name of setting ``key`` that no plugin
        provides: how many, the first :data:`_UNKNOWN_SHOWN` with a "did you mean" each, and the
        known backends. Its work is bounded by what it shows, not by the length of the list."""
        if not names:
            return
        where = f"{key} ({self.settings.sources.get(key)})"
        if len(names) == 1:
            said = f"{where} names {names[0]!r}, which no installed plugin provides{_close(names[0], known)}"
        else:
            shown = ", ".join(f"{name!r}{_close(name, known)}" for name in names[:_UNKNOWN_SHOWN])
            more = len(names) - _UNKNOWN_SHOWN
            shown += f" and {more:,} more" if more > 0 else ""
            said = f"{where} names {len(names):,} backends that no installed plugin provides: {shown}"
        msg = f"{said}; known backends: {', '.join(known)}"
        if self.settings.strict:
            raise ConfigError(msg + " (ACCELREG_STRICT is set)")
        self.warn(msg)

    def _choose(self, name: str, offers: list[tuple[Plugin, BackendSpec]]) -> Backend | None:
        s = self.settings
        blocked = None
        if name in s.disable:
            blocked = f"disabled by {s.sources.get('disable')}"
        builtins = [o for o in offers if o[0].builtin]
        externals = [o for o in offers if not o[0].builtin]
        wanted = s.providers.get(name)
        if wanted is not None:
            picked = [o for o in offers if norm(o[0].distribution) == norm(wanted)]
            if not picked and not _distribution_installed(wanted):
                msg = (
                    f"providers ({s.sources.get('providers')}) picks {wanted!r} for {name!r}, but no "
                    f"distribution {wanted!r} is installed; that entry is ignored"
                )
                if s.strict:
                    raise ConfigError(msg + " (ACCELREG_STRICT is set)")
                self.warn(msg)
            elif not picked:
                dists = ", ".join(sorted({o[0].distribution for o in offers}))
                msg = (
                    f"providers ({s.sources.get('providers')}) picks {wanted!r} for {name!r}, but "
                    f"{wanted!r} registers no {name!r} backend; {name!r} is provided by: {dists}"
                )
                return self._conflict(name, offers, msg)
            else:
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
        self.warn(msg, emit=False)  # warned when resolve() has to pass over it
        plugin, spec = offers[0]
        return Backend(spec, plugin, self, blocked=f"conflict: {msg}")

    def after_fork(self) -> None:
        """Fresh locks and an empty answer cache in a forked child (see registry docs)."""
        self._fail_lock = threading.Lock()
        self._rules_lock = threading.Lock()
        self.cache = {}
        for backend in self.order:
            backend.after_fork()

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

    def passed_over(self, current: Backend) -> list[tuple[str, str]]:
        """``(backend, why)`` for each backend that is present here but failing, and that
        ``current`` was chosen over: ranked before it, or (when ``current`` is cpu) an
        installed external plugin that failed to load. Empty when nothing was passed over."""
        out: list[tuple[str, str]] = []
        for b in self.order:
            if b is current:
                break
            if b.name in self.conflicts:
                out.append((b.name, self.conflicts[b.name]))
                continue
            if b.blocked is not None:
                continue  # disabled: the user said so
            why = b.presence()
            if why is not None:
                reason = b.probe().availability.reason
                out.append((b.name, f"{b.name} is present ({why}) but unavailable: {reason}"))
        if current.name == "cpu":
            for f in list(self.failures):
                external = f.distribution not in ("", "<registered>", "accelreg")
                if f.stage in _LOAD_STAGES and external and f.plugin not in self.by_name:
                    dist = f"{f.distribution} {f.version}".strip()
                    out.append(
                        (
                            f.plugin,
                            f"{f.plugin} is present (plugin {f.plugin!r} of {dist} is installed) "
                            f"but its {f.stage} failed: {f.error}",
                        )
                    )
        return out

    def rules(self, backend: str) -> tuple[tuple[Plugin, PlacementRule], ...]:
        """Every valid placement rule any plugin yields for ``backend`` (cached per snapshot);
        an invalid one is a contained failure of the plugin that yielded it."""
        cached = self._rules.get(backend)
        if cached is not None:
            return cached
        if not acquire(self._rules_lock):  # inside an import, another thread asking: never wait
            return self._find_rules(backend)
        try:
            cached = self._rules.get(backend)
            if cached is None:
                cached = self._rules[backend] = self._find_rules(backend)
        finally:
            self._rules_lock.release()
        return cached

    def _find_rules(self, backend: str) -> tuple[tuple[Plugin, PlacementRule], ...]:
        found: list[tuple[Plugin, PlacementRule]] = []
        for plugin, fn in self._loaded.implementations("accelreg_placement_rules"):
            try:
                rules = call_hook(plugin, fn, self.settings.probe_timeout, backend=backend)
            except CONTAINED as exc:
                self.fail(plugin, "accelreg_placement_rules", exc)
                continue
            for rule in rules:
                try:
                    found.append((plugin, own_rule(rule)))
                except ValueError as exc:  # the rule's own problem, in words
                    problem = f"yielded an invalid placement rule: {safe_str(exc)}"
                    self.fail(plugin, "accelreg_placement_rules", Nonsense(problem))
                except CONTAINED as exc:
                    problem = f"yielded a placement rule that cannot be read: {describe(exc)}"
                    self.fail(plugin, "accelreg_placement_rules", Nonsense(problem))
        return tuple(found)
