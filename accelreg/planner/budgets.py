"""Memory budgets: normalise a ``max_memory`` mapping, or ask the registry for this machine's.

Keys (:func:`budget_key`) are ``"cpu"``, ``"disk"``, ``"name:index"`` strings for any backend
name (``"npu:0"``: taken as given, even when that backend is absent here, so a laptop can plan
for a cluster node), a bare name only for a registered backend that addresses devices without
an index (``"hpu"``), ``int`` indices (by ``operator.index``, resolved through the registry:
``0`` -> ``"npu:0"`` on an Ascend node, :class:`~accelreg.DeviceError` without an accelerator)
and ``torch.device`` objects. Two keys for one device (``"hpu"`` and ``"hpu:0"``) are refused.
Values are bytes or size strings (see :mod:`accelreg.sizes`).

Accelerators are tried in a fixed order: backends in the order their first key appears, devices
of one backend by index. ``cpu`` and ``disk`` are only used when they have a budget.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import registry
from ..errors import DeviceMapError
from ..resolution import current_in_use, qualify
from ..sizes import parse_size

__all__ = [
    "RESERVE",
    "Budgets",
    "budget_key",
    "device_key",
    "missing_devices",
    "parse_budgets",
    "registry_budgets",
]

#: Fraction of each device's free memory (and of the host's available memory) left unplanned
#: when budgets come from the registry: room for activations, allocator fragmentation and the
#: runtime itself. transformers keeps the same 10 % on a lone device and on the cpu.
RESERVE = 0.10

_DEVICE = re.compile(r"([a-z][a-z0-9_]*)(?::([0-9]{1,9}))?")
_NOT_PLACES = frozenset({"meta", "auto", "balanced", "balanced_low_0", "sequential"})


@dataclass(frozen=True)
class Budgets:
    """Budgets in planning order.

    Attributes:
        accelerators: ``(device, bytes)`` pairs, in the order devices are filled.
        cpu: Bytes on the host, or ``None`` when the cpu may not be used.
        disk: Bytes on disk, or ``None`` when disk offload may not be used.
        source: ``"max_memory"`` or ``"registry"``.
    """

    accelerators: tuple[tuple[str, int], ...]
    cpu: int | None
    disk: int | None
    source: str = "max_memory"

    def as_dict(self) -> dict[str, int]:
        """``{"npu:0": ..., "cpu": ..., "disk": ...}`` in planning order."""
        out = dict(self.accelerators)
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.disk is not None:
            out["disk"] = self.disk
        return out

    @property
    def backend(self) -> str:
        """The backend whose placement rules apply: the first accelerator's, else ``"cpu"``."""
        for device, _ in self.accelerators:
            return device.split(":", 1)[0]
        return "cpu"


def device_key(key: Any, *, what: str = "max_memory key") -> str:
    """A device-map place as a fully qualified string: ``"npu:0"``, ``"cpu"``, ``"disk"``.

    Strings are checked for form only (so absent backends work); ints (by ``operator.index``)
    go through the registry; a bare name is kept as given.
    """
    return _place(key, what)[0]


def budget_key(key: Any) -> str:
    """A ``max_memory`` key as the place it budgets (see the module docstring).

    ``"name:index"``, ``"cpu"`` and ``"disk"`` are checked for form only (no registry, so a
    laptop can plan for a node with another backend); ints and bare names ask the registry.
    Raises :class:`TypeError` for a key of the wrong type and :class:`DeviceMapError` for a
    string that is no place, naming the accepted forms and the closest registered name.
    """
    place, bare = _place(key, "max_memory key")
    if not bare:
        return place
    backend = _registered(place)
    if backend is not None and not backend.spec.indexed:
        return place
    if backend is not None:
        raise DeviceMapError(
            f"max_memory key {key!r} names no single device: {place} addresses devices by index "
            f"({place + ':0'!r}, ...); accepted: {_FORMS}"
        )
    raise DeviceMapError(f"max_memory key {key!r} is not a device: expected {_FORMS}{_hint(key)}")


_FORMS = "'cpu', 'disk', an int index, or 'name:index' such as 'npu:0'"


def _place(key: Any, what: str) -> tuple[str, bool]:
    """``(place, bare)``: the place ``key`` names, and whether it is a bare backend name."""
    import torch

    if isinstance(key, bool):
        raise TypeError(f"{what} {key!r} is a bool, not a device")
    if not isinstance(key, (str, torch.device)) and hasattr(type(key), "__index__"):
        index = operator.index(key)  # the value Python and torch use, whatever int() says
        if index < 0:
            raise DeviceMapError(f"{what} {index}: device indices are never negative")
        return qualify(index), False
    if isinstance(key, torch.device):
        key = str(key)
    if not isinstance(key, str):
        raise TypeError(f"{what} {_shown(key)}: expected {_FORMS}")
    m = _DEVICE.fullmatch(key)
    if m is None:
        raise DeviceMapError(f"{what} {_shown(key)} is not a device: expected {_FORMS}{_hint(key)}")
    name, index = m.group(1), m.group(2)
    if name in _NOT_PLACES:
        raise DeviceMapError(
            f"{what} {key!r} is not a place weights can live on (use a device, 'cpu' or 'disk')"
        )
    if name in ("cpu", "disk"):
        if index not in (None, "0"):
            raise DeviceMapError(f"{what} {key!r}: {name} has no index")
        return name, False
    if index is not None:
        return f"{name}:{int(index)}", False
    return name, True


def _registered(name: str) -> Any:
    """The registered backend called (or with device type) ``name``, or ``None``."""

    snap = registry.get()
    return snap.by_name.get(name) or next((b for b in snap.order if b.device_type == name), None)


def _shown(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(key: str) -> str:
    """``; did you mean 'npu:0'?`` for a near miss of a registered name, else ``""``."""

    snap = registry.get()
    names = [*snap.by_name, "disk"]
    low = key.strip().lower()
    m = re.fullmatch(r"([a-z][a-z0-9_]*?)[ _-]?:?([0-9]+)", low)
    candidates = [f"{m.group(1)}:{int(m.group(2))}"] if m and m.group(1) in snap.by_name else []
    if not candidates:
        word = low.split(":", 1)[0]
        close = difflib.get_close_matches(word, names, n=1)
        if close:
            candidates = [close[0] if close[0] in ("cpu", "disk") else f"{close[0]}:0"]
    return f"; did you mean {candidates[0]!r}?" if candidates and candidates[0] != key else ""


def parse_budgets(max_memory: Mapping[Any, Any]) -> Budgets:
    """Normalise a ``max_memory`` mapping (see the module docstring)."""
    if not isinstance(max_memory, Mapping):
        raise TypeError(
            f"max_memory must be a mapping such as {{'npu:0': '20GiB', 'cpu': '64GiB'}}, got {type(max_memory).__name__}"
        )
    seen: dict[str, Any] = {}
    cpu = disk = None
    accelerators: list[tuple[str, int]] = []
    for key, value in max_memory.items():
        device = budget_key(key)
        if device in seen:
            raise DeviceMapError(
                f"max_memory names {device!r} twice (as {_shown(seen[device])} and {_shown(key)}): "
                "one budget per device"
            )
        seen[device] = key
        size = parse_size(value, what=f"max_memory[{key!r}]")
        if device == "cpu":
            cpu = size
        elif device == "disk":
            disk = size
        else:
            accelerators.append((device, size))
    _refuse_aliases(seen)
    backends: dict[str, int] = {}
    for device, _ in accelerators:
        backends.setdefault(device.split(":", 1)[0], len(backends))

    def order(item: tuple[str, int]) -> tuple[int, int]:
        name, _, index = item[0].partition(":")
        return backends[name], int(index) if index else -1

    accelerators.sort(key=order)
    return Budgets(tuple(accelerators), cpu, disk, "max_memory")


def _refuse_aliases(seen: dict[str, Any]) -> None:
    """``"hpu"`` and ``"hpu:0"`` are one device of a backend that addresses it without an
    index: two budgets for it are refused, and ``"hpu:1"`` names nothing there."""
    bare = {d for d in seen if ":" not in d and d not in ("cpu", "disk")}
    for device, key in seen.items():
        name, _, index = device.partition(":")
        if index and name in bare:
            if index == "0":
                raise DeviceMapError(
                    f"max_memory names {name!r} twice (as {_shown(seen[name])} and {_shown(key)}): "
                    f"{name} addresses its device without an index, so both keys are one device"
                )
            raise DeviceMapError(
                f"max_memory key {_shown(key)}: {name} addresses its device without an index; use {name!r}"
            )


def registry_budgets() -> Budgets:
    """This machine's budgets: the free memory of each device of the current backend (the one
    ``resolve()`` uses) and the host's available memory, each less :data:`RESERVE`; no disk.

    Only the current backend: a node with two runtimes (cuda and npu) never gets a map that
    mixes them."""

    snap = registry.get()
    current = current_in_use(snap).name
    accelerators: list[tuple[str, int]] = []
    cpu = None
    for b in snap.order:
        if b.name == "cpu":
            info = b.memory(0)
            if info is None:
                raise DeviceMapError(
                    "the cpu backend reports no memory information; pass max_memory explicitly"
                )
            cpu = int(info.free * (1 - RESERVE))
            continue
        if not b.available or b.name != current:
            continue
        for i, device in enumerate(b.info().devices()):
            info = b.memory(i)
            if info is None:
                raise DeviceMapError(
                    f"{device} reports no memory information (backend {b.name!r} has no memory_info probe); "
                    "pass max_memory explicitly"
                )
            accelerators.append((device, int(info.free * (1 - RESERVE))))
    return Budgets(tuple(accelerators), cpu, None, "registry")


def missing_devices(places: Any) -> dict[str, str]:
    """``{place: why this process cannot use it}`` for each accelerator among ``places`` that
    does not exist here (``"cpu"`` and ``"disk"`` always do): a backend that is not registered
    or not available (with its own reason), or an index past its device count. A map planned
    for another machine is fine to print; this says why it cannot be loaded in this one."""

    snap = registry.get()
    out: dict[str, str] = {}
    for place in dict.fromkeys(places):
        if not isinstance(place, str) or place in ("cpu", "disk") or place in out:
            continue
        name, _, index = place.partition(":")
        backend = _registered(name)
        if backend is None:
            out[place] = (
                f"no backend called {name!r} is registered here (registered: {', '.join(snap.by_name)})"
            )
        elif not backend.available:
            out[place] = f"{backend.name} is not available here: {backend.probe().availability.reason}"
        elif index and backend.spec.indexed and int(index) >= backend.count:
            devices = ", ".join(backend.info().devices())
            out[place] = f"{backend.name} has {backend.count} device(s) here ({devices})"
    return out
