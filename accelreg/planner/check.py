"""Validate any device map against the planner's rules and name every violation.

The rules: every parameter and persistent buffer is covered by exactly one key; keys name
modules or tensors of the model; values are places (``"npu:0"``, ``"cpu"``, ``"disk"``, or ints
resolved through the registry); tied tensors (shared storage, declared ties, the caller's ties)
share a place; a no-split module is not split; a module's own tensors share a place; quantized
weights are only where their placement rule allows; and, when budgets are given, no place holds
more than its budget, counting offload headroom (the main device, the first accelerator in the
map, keeps room for the largest layer on cpu or disk; the cpu for the largest layer on disk).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..sizes import format_size
from .budgets import Budgets
from .layout import Layout
from .maps import expand, place_of

__all__ = ["loads", "violations"]

_SHOWN = 8


def _names(items: list[str], limit: int = _SHOWN) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def _spread(layout: Layout, tensors: range | list[int], places: list[str | None]) -> dict[str, list[str]]:
    by_place: dict[str, list[str]] = {}
    for t in tensors:
        p = places[t]
        if p is not None:
            by_place.setdefault(p, []).append(layout.names[t])
    return by_place


def _describe(by_place: dict[str, list[str]]) -> str:
    return "; ".join(f"{_names(names, 3)} on {place}" for place, names in by_place.items())


def loads(layout: Layout, places: list[str | None]) -> dict[str, int]:
    """Bytes on each place, each storage counted once per place it is on."""
    out: dict[str, int] = {}
    seen: set[tuple[int, str]] = set()
    storage, size = layout.storage, layout.storage_size
    for t, p in enumerate(places):
        if p is None:
            continue
        s = storage[t]
        if (s, p) in seen:
            continue
        seen.add((s, p))
        out[p] = out.get(p, 0) + size[s]
    return out


def main_device(device_map: Mapping[Any, Any]) -> str | None:
    """The first accelerator value in the map's order: where accelerate runs offloaded layers."""
    return next(iter(_accelerators(device_map)), None)


def _accelerators(device_map: Mapping[Any, Any]) -> list[str]:
    """Every accelerator among the map's values, in map order (stock dispatch picks among them)."""
    out: dict[str, None] = {}
    for value in device_map.values():
        try:
            place = place_of(value)
        except (ValueError, TypeError):
            continue
        if place not in ("cpu", "disk"):
            out[place] = None
    return list(out)


def violations(
    layout: Layout,
    device_map: Mapping[Any, Any],
    budgets: Budgets | None,
    ties: list[list[str]],
    *,
    any_main: bool = False,
) -> list[str]:
    """Every rule ``device_map`` breaks, one readable line each (empty when it is valid); with
    ``any_main`` every accelerator the map uses keeps the offload headroom."""
    if not isinstance(device_map, Mapping):
        return [f"a device map is a mapping of module names to places, not {type(device_map).__name__}"]
    places, coverage, problems, multiple = expand(layout, device_map)
    out = list(problems)
    names = layout.names
    n = len(names)

    missing = [t for t in range(n) if layout.required[t] and coverage[t] == 0]
    if missing:
        out.append(
            f"{len(missing)} parameter(s)/persistent buffer(s) covered by no key: "
            + _names([names[t] for t in missing])
        )
    for t, keys in multiple:
        out.append(
            f"{names[t]!r} is covered by {len(keys)} keys ({', '.join(repr(k) for k in keys)}); cover it once"
        )

    # Atoms: no-split blocks and each module's own tensors stay together.
    for a in range(len(layout.atom_start)):
        s, e = layout.atom_start[a], layout.atom_end[a]
        first = places[s]
        if e - s == 1 or all(places[t] == first for t in range(s + 1, e)):
            continue
        spread_map = _spread(layout, range(s, e), places)
        if len(spread_map) < 2:
            continue
        m = layout.atom_module[a]
        path = layout.paths[m] or "(the model)"
        spread = _describe(spread_map)
        if layout.atom_block[a]:
            out.append(f"no-split module {path!r} ({layout.class_name(m)}) is split: {spread}")
        elif layout.own_end[m] == layout.end[m]:
            out.append(
                f"module {path!r} ({layout.class_name(m)}) is split, but its forward uses all its tensors: {spread}"
            )
        else:
            out.append(f"the own parameters/buffers of module {path!r} are split: {spread}")

    # Ties: tensors sharing a storage, then declared and caller-given groups.
    by_storage: dict[int, list[int]] = {}
    for t in range(n):
        by_storage.setdefault(layout.storage[t], []).append(t)
    reported: set[frozenset[str]] = set()
    for members in by_storage.values():
        if len(members) < 2:
            continue
        spread_map = _spread(layout, members, places)
        if len(spread_map) > 1:
            group = sorted(names[t] for t in members)
            reported.add(frozenset(group))
            out.append(f"tied group [{', '.join(group)}] is split: {_describe(spread_map)}")
    index = layout.tensor_index
    for group in ties:
        members = [index[name] for name in group if name in index]
        spread_map = _spread(layout, members, places)
        key = frozenset(names[t] for t in members)
        if len(spread_map) > 1 and not any(key <= r for r in reported):
            reported.add(key)
            out.append(f"tied group [{', '.join(sorted(key))}] is split: {_describe(spread_map)}")

    # Quantized weights only where their rule allows.
    for t, (method, rule) in sorted(layout.quantized.items()):
        p = places[t]
        if p is not None and not rule.may_live_on(p):
            allowed = ", ".join(sorted(rule.offload)) or "accelerators only"
            out.append(
                f"{names[t]!r} is a {method} weight on {p}, but the {method} placement rule for backend "
                f"{rule.backend!r} ({rule.provider or 'a plugin'}) allows: {allowed}"
            )

    if budgets is not None:
        out.extend(_budget_violations(layout, device_map, places, budgets, any_main=any_main))
    return out


def offloaded_layers(layout: Layout, places: list[str | None]) -> tuple[tuple[int, str], tuple[int, str]]:
    """``((size, name), (size, name))``: the largest layer on cpu or disk, and on disk."""
    off = (0, "")
    disk = (0, "")
    for a in range(len(layout.atom_start)):
        p = places[layout.atom_start[a]]
        if p not in ("cpu", "disk"):
            continue
        item = (layout.atom_size[a], layout.atom_name(a))
        off = max(off, item)
        if p == "disk":
            disk = max(disk, item)
    return off, disk


def headroom(
    layout: Layout, device_map: Mapping[Any, Any], places: list[str | None], *, any_main: bool = False
) -> dict[str, tuple[int, str]]:
    """Headroom each place must keep: ``{place: (bytes, why)}``; with ``any_main`` on every
    accelerator the map uses, else on the main device (the map's first accelerator)."""
    (off, off_name), (disk, disk_name) = offloaded_layers(layout, places)
    out: dict[str, tuple[int, str]] = {}
    main = main_device(device_map)
    if off and any_main:
        why = f"to run the largest offloaded layer, {off_name!r}, should stock dispatch pick this device"
        for place in _accelerators(device_map):
            out[place] = (off, why)
    elif off and main is not None:
        out[main] = (off, f"to run the largest offloaded layer, {off_name!r}, on the main device")
    if disk:
        out["cpu"] = (disk, f"to stage the largest disk-offloaded layer, {disk_name!r}")
    return out


def _budget_violations(
    layout: Layout,
    device_map: Mapping[Any, Any],
    places: list[str | None],
    budgets: Budgets,
    *,
    any_main: bool = False,
) -> list[str]:
    out = []
    caps = budgets.as_dict()
    used = loads(layout, places)
    room = headroom(layout, device_map, places, any_main=any_main)
    for place in sorted(set(used) | set(room), key=lambda p: (p in ("cpu", "disk"), p == "disk", p)):
        amount = used.get(place, 0)
        extra, why = room.get(place, (0, ""))
        if place not in caps:
            if amount:
                out.append(f"{place} holds {format_size(amount)}, but max_memory gives it no budget")
            continue
        need = amount + extra
        if need > caps[place]:
            detail = f"{format_size(amount)} placed"
            if extra:
                detail += f" + {format_size(extra)} headroom {why}"
            out.append(
                f"{place}: {detail} exceeds its {format_size(caps[place])} budget by {format_size(need - caps[place])}"
            )
    return out
