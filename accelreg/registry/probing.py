"""Backend probing: what each selected backend's probes say, checked and cached.

A :class:`Backend` wraps the registry's own copy of a plugin's spec. Each probe runs contained
(see :mod:`.containment`) together with the check of its answer, so an answer that cannot be
compared or printed fails inside the containment like a probe that raises. Availability,
device count and visible devices are probed once per snapshot; :meth:`Backend.presence` says
whether a backend that is unavailable is nevertheless *present* here (its runtime package is
installed, its visible-devices variable is set, configuration names it), which is what decides
between a silent and a loud fallback to ``cpu``.
"""

from __future__ import annotations

import importlib.util
import operator
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import DeviceError
from ..types import Availability, BackendInfo, BackendSpec, MemoryInfo, PluginFailure
from .containment import (
    CONTAINED,
    Nonsense,
    acquire,
    call_inline,
    call_with_timeout,
    describe,
    safe_repr,
    safe_str,
)
from .visible import parse_visible_devices

if TYPE_CHECKING:
    from collections.abc import Callable

    from .loading import Plugin
    from .snapshot import Snapshot

__all__ = ["Backend", "Probed", "parse_visible"]

_MAX_COUNT = 1 << 16
_UNSET: Any = object()
#: Limits of a ``versions`` answer: entries, and characters of a key and of a value.
_MAX_VERSIONS, _MAX_VERSION_KEY, _MAX_VERSION_VALUE = 16, 64, 200


class Probed(NamedTuple):
    """What one backend's probes said, computed once per snapshot."""

    availability: Availability
    count: int
    visible: tuple[str, ...] | None
    visible_error: str | None


class ProbeFailed(Exception):
    """A probe raised, hung or answered nonsense; the failure is already recorded."""

    def __init__(self, failure: PluginFailure, nonsense: bool) -> None:
        super().__init__(failure.error)
        self.failure = failure
        self.nonsense = nonsense


# -- checks of probe answers (run inside the containment) -----------------------------------
def _exact_int(value: Any) -> int | None:
    """``value`` as an exact int when it is an int (never a bool); else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return operator.index(value)  # an int subclass's own value, whatever its methods say


def check_availability(value: Any) -> Availability:
    """An :class:`Availability` from what ``is_available`` answered."""
    if isinstance(value, Availability):
        available, reason = value.available, value.reason
    elif isinstance(value, bool):
        available = value
        reason = "available" if value else "unavailable (the plugin gave no reason)"
    elif isinstance(value, tuple) and tuple.__len__(value) == 2:
        available, reason = tuple.__getitem__(value, 0), tuple.__getitem__(value, 1)
    else:
        available = reason = None
    if not isinstance(available, bool) or not isinstance(reason, str):
        raise Nonsense(f"is_available returned {safe_repr(value)}, not an Availability, bool or (bool, str)")
    return Availability(bool(available), safe_str(reason))


def check_count(value: Any) -> int:
    """The device count ``device_count`` answered, or :class:`Nonsense`."""
    count = _exact_int(value)
    if count is None or not 0 <= count < _MAX_COUNT:
        raise Nonsense(f"device_count returned {safe_repr(value)}, not a non-negative int")
    return count


def check_memory(value: Any) -> MemoryInfo | None:
    """A fresh :class:`MemoryInfo` from what ``memory_info`` answered (``None`` is allowed)."""
    if value is None:
        return None
    if isinstance(value, MemoryInfo):
        free, total = _exact_int(value.free), _exact_int(value.total)
        if free is not None and total is not None and 0 <= free <= total:
            return MemoryInfo(free=free, total=total)
    raise Nonsense(f"memory_info returned {safe_repr(value)}")


def check_versions(value: Any) -> dict[str, str]:
    """A plain ``{what: version}`` dict from what ``versions`` answered, or :class:`Nonsense`."""
    if not isinstance(value, Mapping):
        raise Nonsense(f"versions returned {safe_repr(value)}, not a mapping of str to str")
    items = list(value.items())
    if len(items) > _MAX_VERSIONS:
        raise Nonsense(f"versions returned {len(items)} entries; at most {_MAX_VERSIONS}")
    out: dict[str, str] = {}
    for key, version in items:
        if not isinstance(key, str) or not isinstance(version, str):
            raise Nonsense(f"versions returned {safe_repr(key)}: {safe_repr(version)}, not str: str")
        key, version = str.__str__(key).strip(), str.__str__(version).strip()
        if not key or len(key) > _MAX_VERSION_KEY or len(version) > _MAX_VERSION_VALUE:
            raise Nonsense(f"versions returned {safe_repr(key)}: {safe_repr(version)}: too long or empty")
        if version:
            out[key] = version
    return out


def check_name(value: Any) -> str:
    """A device name from what ``device_name`` answered (one line, at most 200 characters)."""
    if not isinstance(value, str):
        raise Nonsense(f"device_name returned {safe_repr(value)}, not a str")
    return " ".join(str.__str__(value).split())[:200]


def parse_visible(spec: BackendSpec, value: str) -> tuple[tuple[str, ...] | None, str | None]:
    """``(physical ids, None)`` for a value of ``spec``'s visible-devices variable, or
    ``(None, problem)`` when the value is invalid or the parser answers nonsense. Any other
    exception of a plugin's parser propagates (callers run it as a contained probe).

    A value that is empty (or only blanks) means "no device visible" and never reaches the
    parser: every runtime reads it that way, and no plugin has to handle it.
    """
    if value.strip() == "":
        return (), None
    parse = spec.parse_visible_devices
    if parse is None:
        var = spec.visible_devices_var or "visible devices"

        def parse(v: str) -> tuple[str, ...]:
            return parse_visible_devices(v, var=var)

    try:
        ids = parse(value)
    except ValueError as exc:  # a value the runtime would not accept: the user's problem
        return None, safe_str(exc)
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids):
        return None, f"parser returned {safe_repr(ids)}, not a sequence of str"
    return tuple(str.__str__(i) for i in ids), None


def package_installed(package: str) -> bool:
    """Whether the top-level package of ``package`` can be found. Only the top level is looked
    up: finding a submodule would import its parents, i.e. run vendor code."""
    return importlib.util.find_spec(package.split(".", 1)[0]) is not None


class Backend:
    """A selected backend: the registry's copy of its spec, its provider and its probed state.

    Internal: the live object behind the public records (a plugin declares a
    :class:`~accelreg.types.BackendSpec`; users read :meth:`info`, a
    :class:`~accelreg.types.BackendInfo`)."""

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
        self._presence: str | None = _UNSET
        self._presence_lock = threading.Lock()  # presence() probes, which takes _lock
        self._memo: dict[Any, Any] = {}
        self._memo_lock = threading.RLock()  # held while a memoised answer is computed (which may memo)
        # accelreg's own cpu backend answers at once and must exist whatever probe_timeout says.
        self._inline = plugin.builtin and spec.name == "cpu"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device_type(self) -> str:
        return self.spec.torch_type

    # -- probes ---------------------------------------------------------------------------
    def call(
        self, what: str, fn: Callable[..., Any], *args: Any, check: Callable[[Any], Any] | None = None
    ) -> Any:
        """Call one of this backend's probes (and ``check`` its answer), contained and timed."""

        def job() -> Any:
            value = fn(*args)
            return value if check is None else check(value)

        try:
            if self._inline:
                return call_inline(job)
            return call_with_timeout(job, (), self._snapshot.settings.probe_timeout)
        except CONTAINED as exc:
            failure = self._snapshot.fail(self.plugin, f"probe {what} of {self.name!r}", exc)
            raise ProbeFailed(failure, isinstance(exc, Nonsense)) from exc

    def probe(self) -> Probed:
        """Availability, device count and visible devices, probed once."""
        probed = self._probed
        if probed is None:
            if not acquire(self._lock):  # inside an import, another thread probing: never wait
                return self._probe()
            try:
                probed = self._probed
                if probed is None:
                    probed = self._probed = self._probe()
            finally:
                self._lock.release()
        return probed

    def _probe(self) -> Probed:
        visible, visible_error = self._visible()
        if self.blocked is not None:
            return Probed(Availability.no(self.blocked), 0, visible, visible_error)
        try:
            availability = self.call("is_available", self.spec.is_available, check=check_availability)
            count = 0
            if availability.available:
                count = self.call("device_count", self.spec.device_count, check=check_count)
                if count == 0:
                    availability = Availability.no(f"{self.name} reports no devices")
        except ProbeFailed as failed:
            how = "answered nonsense" if failed.nonsense else "raised"
            return Probed(Availability.no(f"probe {how}: {failed.failure.error}"), 0, visible, visible_error)
        return Probed(availability, count, visible, visible_error)

    def _visible(self) -> tuple[tuple[str, ...] | None, str | None]:
        var = self.spec.visible_devices_var
        value = self._snapshot.environ.get(var) if var else None
        if value is None:
            return None, None
        if value.strip() == "" or self.spec.parse_visible_devices is None:
            return parse_visible(self.spec, value)
        # A plugin's own parser is a probe like any other: contained, timed, recorded.
        try:
            ids, problem = self.call("parse_visible_devices", parse_visible, self.spec, value)
        except ProbeFailed as failed:
            return None, f"parser failed: {failed.failure.error}"
        if problem is not None and problem.startswith("parser returned"):
            self._snapshot.fail(
                self.plugin, f"probe parse_visible_devices of {self.name!r}", Nonsense(problem)
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
        limit = max(self.count, 1)

        def check(index: Any) -> int:
            value = _exact_int(index)
            if value is None or not 0 <= value < limit:
                raise Nonsense(f"current_index returned {safe_repr(index)}, not an index below {self.count}")
            return value

        try:
            return self.call("current_index", fn, check=check)
        except ProbeFailed as failed:
            raise DeviceError(
                f"{self.name}: cannot read the current device: {failed.failure.error}"
            ) from None

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

        def check(dev: Any) -> Any:
            if not isinstance(dev, torch.device) or dev.type != self.device_type:
                raise Nonsense(f"device({index}) returned {safe_repr(dev)}, not a {self.device_type} device")
            return dev

        try:
            return self.call("device", fn, index, check=check)
        except ProbeFailed as failed:
            raise DeviceError(
                f"{self.name}: cannot map index {index} to a device: {failed.failure.error}"
            ) from None

    def memory(self, index: int) -> MemoryInfo | None:
        """Free/total bytes of device ``index`` right now, or ``None`` if unknown."""
        fn = self.spec.memory_info
        if fn is None or not self.available:
            return None
        try:
            return self.call("memory_info", fn, index, check=check_memory)
        except ProbeFailed:
            return None

    def versions(self) -> dict[str, str]:
        """The runtime's versions as the plugin reports them (``{}`` without a ``versions``
        probe, or when it fails: the failure is recorded); asked whether or not available."""
        fn = getattr(self.spec, "versions", None)
        if fn is None:
            return {}
        try:
            return self.call("versions", fn, check=check_versions)
        except ProbeFailed:
            return {}

    def device_name(self, index: int) -> str | None:
        """The product name of device ``index``, or ``None`` (no ``device_name`` probe, the
        backend unavailable, an index past the count, or the probe failed: recorded)."""
        fn = getattr(self.spec, "device_name", None)
        if fn is None or not self.available or not 0 <= index < max(self.count, 1):
            return None
        try:
            return self.call("device_name", fn, index, check=check_name) or None
        except ProbeFailed:
            return None

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``'s answer, computed once per snapshot for ``key`` (answers built from
        probes, such as a device's capabilities). Inside an import, with another thread
        computing, it computes without caching rather than wait (as :meth:`probe` does)."""
        try:
            return self._memo[key]
        except KeyError:
            pass
        if not acquire(self._memo_lock):
            return compute()
        try:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]
        finally:
            self._memo_lock.release()

    # -- presence -------------------------------------------------------------------------
    def presence(self) -> str | None:
        """Why this backend counts as present here, or ``None``.

        Present: plugins conflict over it, its runtime package is installed, its ``presence``
        probe names a reason (hardware or driver found for a runtime shipped with torch), its
        visible-devices variable lists devices (or is invalid), ``providers`` names it, or
        ``priority`` names it in an argument or environment variable (an instruction for this
        process; a priority list in a file is a preference shared by many machines). Disabled
        backends are never present: disabling is how a user says "not here".
        """
        presence = self._presence
        if presence is _UNSET:
            if not acquire(self._presence_lock):  # as in probe(): an importing thread never waits
                return self._find_presence()
            try:
                presence = self._presence
                if presence is _UNSET:
                    presence = self._presence = self._find_presence()
            finally:
                self._presence_lock.release()
        return presence

    def _find_presence(self) -> str | None:
        snap, name = self._snapshot, self.name
        s = snap.settings
        if name in s.disable:
            return None
        if name in snap.conflicts:
            return "installed plugins conflict over it"  # and the conflict says which
        package = self.spec.runtime_package
        if package:
            top = package.split(".", 1)[0]
            try:
                if package_installed(package):
                    return f"{top} is installed"
            except CONTAINED as exc:  # a broken install: something of it is there
                return f"{top} is installed but cannot be looked up: {describe(exc)}"
        if self.spec.presence is not None and not self.available:
            try:
                why = self.call("presence", self.spec.presence, check=_check_presence)
            except ProbeFailed:
                why = None  # recorded as the plugin's failure; the other signals still count
            if why:
                return why
        var = self.spec.visible_devices_var
        value = snap.environ.get(var) if var else None
        if value is not None and value.strip() and not _set_by_slurm(snap.environ, value):
            probed = self.probe()
            if probed.visible_error is not None or probed.visible:
                return f"{var}={value!r} is set"
        if name in s.providers:
            return f"providers ({s.sources.get('providers')}) names it"
        source = s.sources.get("priority", "default")
        if name in s.priority and (source == "argument" or source.startswith("env ")):
            return f"priority ({source}) names it"
        return None

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

    def after_fork(self) -> None:
        """Fresh locks in a forked child (another thread may have held one at the fork)."""
        self._lock = threading.Lock()
        self._presence_lock = threading.Lock()
        self._memo_lock = threading.RLock()


def _set_by_slurm(environ: Any, value: str) -> bool:
    """Whether a mask holds the value Slurm writes into every GPU runtime's variable for a job's
    ``gpu`` GRES (``GPU_DEVICE_ORDINAL`` and the others alike, whatever hardware the node has):
    Slurm's bookkeeping, no sign that this backend's hardware is here."""
    slurm = environ.get("SLURM_STEP_GPUS") is not None or environ.get("SLURM_JOB_GPUS") is not None
    return slurm and value == environ.get("GPU_DEVICE_ORDINAL")


def _check_presence(value: Any) -> str | None:
    """A ``presence`` answer: ``None`` or a short reason."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Nonsense(f"presence returned {safe_repr(value)}, not a reason (str) or None")
    return str.__str__(value)[:200] or None
