"""``resolve()``: turn a device spec into a ``torch.device`` that exists here, or say why not.

The hot path is one dictionary lookup: answers are cached per registry snapshot, keyed by the
spec and checked against its exact type (``True == 1`` and ``1.0 == 1`` in Python, but a bool
or a float is never a device index).
"""

from __future__ import annotations

import numbers
import operator
import re
import sys
from typing import TYPE_CHECKING, Any

from . import registry
from ._text import short
from .errors import DeviceError

if TYPE_CHECKING:
    import torch

    from .registry import Backend, Snapshot

__all__ = [
    "assigned_ids",
    "check_fallback",
    "current_in_use",
    "format_device",
    "local_rank",
    "qualify",
    "resolve",
]

#: Answers of the current snapshot: ``spec -> (type(spec), device)``. Replaced, never cleared
#: in place, so a lookup always sees one snapshot's answers.
_CACHE: dict[Any, tuple[type, Any]] = {}
_MAX_CACHED = 4096
_SPEC = re.compile(r"([a-z][a-z0-9_]*)(?::([0-9]{1,9}))?")
_MAP_ONLY = frozenset({"disk"})


def resolve(spec: Any = None, *, backend: str | None = None) -> torch.device:
    """The ``torch.device`` that ``spec`` means in this process.

    Args:
        spec: ``None`` or ``"auto"`` (the current backend's device for this process: index
            ``LOCAL_RANK`` when a launcher set it, else the runtime's current index; ``cpu``
            without an accelerator); an ``int`` index on the current backend (int-likes by
            ``operator.index``); a string such as ``"npu"``, ``"npu:1"``, ``"cpu"``,
            ``"meta"``; or a ``torch.device``.
        backend: Resolve on this backend instead of the current one.

    Raises:
        DeviceError: the spec names no device that exists and is available here (the message
            names what is available); or ``None``/``"auto"`` would fall back to ``cpu`` past an
            accelerator that is present but failing, under a launcher (unless ``cpu_fallback``
            is set) or in strict mode. Outside those it warns once instead.
        TypeError: the spec has the wrong type (``bool``, ``float``, ...).
    """
    if backend is None:
        try:
            hit = _CACHE[spec]
        except (KeyError, TypeError):
            pass
        else:
            if hit[0] is type(spec):
                return hit[1]
    return _resolve_slow(spec, backend)


def _resolve_slow(spec: Any, backend: str | None) -> torch.device:
    snap = registry.get()
    device = resolve_in(snap, spec, backend)
    if backend is None and _cacheable(spec) and len(snap.cache) < _MAX_CACHED:
        snap.cache[spec] = (type(spec), device)
        registry.if_current(snap, lambda: _publish(snap.cache))
    return device


def _publish(cache: dict[Any, tuple[type, Any]]) -> None:
    global _CACHE
    _CACHE = cache


def _drop_cache() -> None:
    _publish({})


registry.on_reset(_drop_cache)


def _cacheable(spec: Any) -> bool:
    kind = type(spec)
    return kind in (type(None), str, int) or kind is sys.modules["torch"].device


def resolve_in(snap: Snapshot, spec: Any, backend: str | None = None) -> torch.device:
    """Resolve ``spec`` against one snapshot (uncached)."""
    import torch

    forced = None
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
        forced = _usable(snap, snap.backend(backend))
    if spec is None:
        return _auto(snap, forced)
    if isinstance(spec, bool):
        raise TypeError(f"{spec!r} is a bool, not a device index; pass an int such as 0")
    if isinstance(spec, numbers.Integral):
        # operator.index: the value Python and torch use (an int subclass's __int__ may lie).
        return _index(snap, forced, operator.index(spec))
    if isinstance(spec, str):
        return _string(snap, forced, spec)
    if isinstance(spec, torch.device):
        return _named(snap, forced, spec.type, spec.index, str(spec))
    raise TypeError(
        f"cannot resolve {type(spec).__name__} {short(spec)}: expected None, 'auto', an int "
        "index, a device string such as 'cpu' or 'npu:0', or a torch.device"
    )


def _usable(snap: Snapshot, b: Backend) -> Backend:
    if b.name in snap.conflicts:
        raise DeviceError(snap.conflicts[b.name])
    if not b.available:
        raise DeviceError(
            f"{b.name} is not available ({b.probe().availability.reason}); available: {snap.available_summary()}"
        )
    return b


def _current_accelerator(snap: Snapshot, what: str) -> Backend:
    b = snap.current()
    if b.name == "cpu":
        passed = snap.passed_over(b)
        why = f" ({'; '.join(line for _, line in passed)})" if passed else ""
        raise DeviceError(
            f"no accelerator is available for {what}; available: cpu{why} "
            "(`accelreg env` shows why each backend is unavailable)"
        )
    return b


def check_fallback(snap: Snapshot, current: Backend, *, launcher_raises: bool = True) -> None:
    """Never silently past a present accelerator: warn once when ``current`` was chosen over a
    backend that is present here but failing; raise :class:`DeviceError` instead in strict
    mode, and (with ``launcher_raises``) when the answer is ``cpu`` in a process a launcher
    started, unless ``cpu_fallback`` is set."""
    passed = snap.passed_over(current)
    if not passed:
        return
    what = "; ".join(line for _, line in passed)
    names = ",".join(sorted({name for name, _ in passed}))
    s = snap.settings
    if s.strict:
        raise DeviceError(f"{what}; resolve() will not use {current.name} instead (ACCELREG_STRICT is set)")
    if launcher_raises and current.name == "cpu" and snap.launcher is not None and not s.cpu_fallback:
        var, value = snap.launcher
        raise DeviceError(
            f"{what}. This process was started by a launcher ({var}={value}), and accelreg will not put "
            f"a distributed job on the cpu silently: fix the accelerator, disable it "
            f"(ACCELREG_DISABLE={names}) or allow the fallback (ACCELREG_CPU_FALLBACK=1)"
        )
    snap.warn(
        f"{what}; using {current.name} instead. If that is intended, disable it "
        f"(ACCELREG_DISABLE={names}, or disable = [...] in accelreg.toml) to silence this warning"
    )


def current_in_use(snap: Snapshot) -> Backend:
    """The current backend for a device decision (a map's budgets, a default device, a
    collective backend), under the same rule as ``resolve()``: a present but failing backend
    passed over warns, and raises under a launcher or in strict mode (see :func:`check_fallback`).
    Reports (``accelreg env``) read ``snap.current()`` instead."""
    b = snap.current()
    check_fallback(snap, b)
    return b


def local_rank(snap: Snapshot) -> int | None:
    """The launcher's local rank, or ``None``; the same verdict on every machine: a value that
    is no non-negative integer, or one at or past a process count the launcher set
    (``LOCAL_WORLD_SIZE``, ..., ``WORLD_SIZE``), is a :class:`DeviceError` with or without an
    accelerator."""
    if snap.local_rank is None:
        return None
    var, text = snap.local_rank
    stripped = text.strip()
    if not re.fullmatch(r"0|[1-9][0-9]{0,8}", stripped):
        raise DeviceError(f"{var}={text!r} is not a valid local rank (a non-negative integer)")
    rank = int(stripped)
    for bound_var, value in snap.rank_bounds:
        size = value.strip()
        if re.fullmatch(r"[1-9][0-9]{0,8}", size) and rank >= int(size):
            raise DeviceError(
                f"{var}={rank}, but {bound_var}={size}: the launcher started {size} process(es), "
                f"so local ranks are 0..{int(size) - 1}"
            )
    return rank


def _cpu_rank(snap: Snapshot) -> None:
    """On the cpu every rank shares the one device, but only ranks a launcher accounts for:
    a rank past 0 needs a process count (``LOCAL_WORLD_SIZE``, ...) that covers it, as on an
    accelerator it needs a device."""
    rank = local_rank(snap)
    if rank and not snap.rank_bounds:
        var, _ = snap.local_rank  # type: ignore[misc]
        raise DeviceError(
            f"{var}={rank}, but no accelerator is available here (only the cpu) and no launcher variable "
            f"says that {rank + 1} or more processes share this node ({', '.join((*registry.LOCAL_SIZE_VARS, 'WORLD_SIZE'))}): "
            "a stale variable, or a launcher accelreg does not know; unset it, or set LOCAL_WORLD_SIZE "
            "(`accelreg env` shows why each backend is unavailable)"
        )


def _auto(snap: Snapshot, b: Backend | None) -> torch.device:
    if b is None:
        b = current_in_use(snap)
        if b.name == "cpu":
            import torch

            _cpu_rank(snap)
            return torch.device("cpu")
    if b.name == "cpu":
        _cpu_rank(snap)
        return b.device(0)
    if not b.spec.indexed:
        local_rank(snap)
        return b.device(0)
    if snap.device_id is not None:
        index = _assigned_index(snap, b)
        if index is not None:
            return b.device(index)
    rank = local_rank(snap)
    if rank is not None:
        var, _ = snap.local_rank  # type: ignore[misc]
        if rank >= b.count:
            raise DeviceError(
                f"{var}={rank}, but {b.name} has {_devices(b)} visible to this process; "
                f"check the launcher's process count and {b.spec.visible_devices_var or 'device mask'}"
            )
        return b.device(rank)
    return _in_range(snap, b, b.current_index())


def assigned_ids(var: str, text: str) -> dict[str, str]:
    """``ACCELREG_DEVICE_ID``'s entries, ``{backend: physical id}``: ``<backend>=<physical id>``,
    or several of them comma-separated, one per backend (``npu=3,cuda=0``); a malformed value
    is a :class:`DeviceError`."""
    out: dict[str, str] = {}
    for entry in text.split(","):
        name, sep, ident = entry.strip().partition("=")
        name, ident = name.strip(), ident.strip()
        if not sep or not name or not ident or name in out:
            raise DeviceError(
                f"{var}={text!r} is not <backend>=<physical device id> (such as npu=3), "
                "or several of them for different backends, comma-separated"
            )
        out[name] = ident
    return out


def _assigned_index(snap: Snapshot, b: Backend) -> int | None:
    """The logical index of the device a scheduler gave this process (``ACCELREG_DEVICE_ID``:
    ``<backend>=<physical id>``, one entry per backend), or ``None`` when it names none for
    this backend."""
    assert snap.device_id is not None
    var, text = snap.device_id
    ident = assigned_ids(var, text).get(b.name)
    if ident is None:
        return None
    visible = b.probe().visible
    mask = b.spec.visible_devices_var or "its visible-devices variable"
    if visible is not None:
        if ident not in visible:
            raise DeviceError(
                f"{var}={text!r}, but {b.name}'s mask {mask}={snap.environ.get(mask, '')!r} does not list "
                f"device {ident}; {b.name} has {_devices(b)} visible to this process"
            )
        index = visible.index(ident)
    elif re.fullmatch(r"0|[1-9][0-9]{0,8}", ident):
        index = int(ident)  # no mask: physical ids are the logical indices
    else:
        raise DeviceError(f"{var}={text!r}: {ident!r} is not a device index, and {mask} is not set")
    if index >= b.count:
        raise DeviceError(f"{var}={text!r}, but {b.name} has {_devices(b)} visible to this process")
    return index


def _devices(b: Backend) -> str:
    n = b.count
    names = ", ".join(b.info().devices())
    return f"{n} device{'s' if n != 1 else ''} ({names})" if n else "no devices"


def _in_range(snap: Snapshot, b: Backend, index: int) -> torch.device:
    if index < 0:
        raise DeviceError(f"device index {index} is negative; {b.name} has {_devices(b)}")
    if index >= b.count:
        raise DeviceError(f'"{b.name}:{index}" is out of range: {b.name} has {_devices(b)}')
    return b.device(index)


def _index(snap: Snapshot, b: Backend | None, index: int) -> torch.device:
    if index < 0:  # the same verdict with or without an accelerator
        raise DeviceError(f"device index {index} is negative; device indices start at 0")
    if b is None:
        b = _current_accelerator(snap, f"device index {index}")
    if b.name == "cpu":
        if index == 0:
            return b.device(0)
        raise DeviceError(f"cpu has one device; index {index} does not exist")
    return _in_range(snap, b, index)


def _string(snap: Snapshot, forced: Backend | None, text: str) -> torch.device:
    m = _SPEC.fullmatch(text)
    if m is None:
        raise DeviceError(_malformed(snap, text))
    name, idx = m.group(1), m.group(2)
    if name == "auto":
        if idx is not None:
            raise DeviceError(f"{text!r}: 'auto' takes no index")
        return _auto(snap, forced)
    return _named(snap, forced, name, None if idx is None else int(idx), text)


def _malformed(snap: Snapshot, text: str) -> str:
    hint = ""
    if text != text.strip():
        hint = " (it has surrounding whitespace)"
    elif text.lower() != text and _SPEC.fullmatch(text.lower()):
        hint = f" (device names are lower case: {text.lower()!r})"
    elif text == "":
        return f"an empty string is not a device; available: {snap.available_summary()}"
    return (
        f"malformed device string {short(text)}{hint}: expected 'name' or 'name:index' "
        f"such as 'cpu' or 'npu:0'; available: {snap.available_summary()}"
    )


def _named(snap: Snapshot, forced: Backend | None, name: str, idx: int | None, text: str) -> torch.device:
    import torch

    if name in ("cpu", "meta"):
        if idx not in (None, 0):
            raise DeviceError(f"{text!r}: {name} has one device ({name!r})")
        return torch.device(name)
    if name in _MAP_ONLY:
        raise DeviceError(f"{name!r} is valid only as a device-map value, not as a device")
    b = snap.by_name.get(name) or next((x for x in snap.order if x.device_type == name), None)
    if b is None:
        raise DeviceError(
            f"unknown device {text!r}: no backend is called {name!r}; registered: "
            f"{', '.join(snap.by_name)}; available: {snap.available_summary()}"
        )
    if forced is not None and b is not forced:
        raise DeviceError(f"{text!r} is not a {forced.name} device (resolve(..., backend={forced.name!r}))")
    b = _usable(snap, b)
    if idx is None:
        return _auto(snap, b)
    if not b.spec.indexed:
        if idx < b.count:
            return b.device(idx)
        raise DeviceError(f'"{text}" is out of range: {b.name} has {_devices(b)}')
    return _in_range(snap, b, idx)


def format_device(device: torch.device) -> str:
    """``"npu:0"``, ``"cpu"``, ``"hpu"``: the fully qualified string for a resolved device."""
    return str(device)


def qualify(value: Any) -> str:
    """A device-map value as a fully qualified string (``0`` -> ``"npu:0"``; ``"disk"`` kept)."""
    if isinstance(value, str) and value in _MAP_ONLY:
        return value
    return format_device(resolve(value))
