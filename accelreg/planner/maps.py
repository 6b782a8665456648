"""Device maps and the layout: write the coarsest map for a placement, read any map back.

A key covers the module (or tensor) it names and everything under it. :func:`emit` writes one
key per maximal uniform subtree, in forward (pre-order) order; when a module's subtree is split,
its own parameters and buffers get a key each (``"model.weight"``), so nothing goes unmapped.
:func:`expand` reads a map (values may be ints, strings or ``torch.device``) back into one place
per tensor, and reports keys that name nothing, values that are no place, and tensors covered
by no key or by several.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .budgets import device_key
from .layout import Layout

__all__ = ["emit", "expand", "place_of"]

_SHOWN = 20


def emit(layout: Layout, places: list[str], main: str | None = None) -> dict[str, str]:
    """The coarsest device map giving tensor ``t`` the place ``places[t]``, in forward order;
    with ``main``, the first key on that device is moved to the front, so that it is the map's
    first accelerator (where accelerate runs offloaded layers)."""
    out = _coarsest(layout, places)
    if main is not None:
        first = next((key for key, place in out.items() if place not in ("cpu", "disk")), None)
        if first is not None and out[first] != main:
            lead = next(key for key, place in out.items() if place == main)
            out = {lead: main, **{key: place for key, place in out.items() if key != lead}}
    return out


def _coarsest(layout: Layout, places: list[str]) -> dict[str, str]:
    n = len(places)
    if n == 0:
        return {}
    run_end = [0] * n
    run_end[n - 1] = n
    for t in range(n - 2, -1, -1):
        run_end[t] = run_end[t + 1] if places[t] == places[t + 1] else t + 1
    start, own_end, end, after, paths, names = (
        layout.start,
        layout.own_end,
        layout.end,
        layout.after,
        layout.paths,
        layout.names,
    )
    out: dict[str, str] = {}
    m, n_modules = 0, len(paths)
    while m < n_modules:
        s, e = start[m], end[m]
        if s == e:
            m = after[m]
            continue
        if run_end[s] >= e:
            out[paths[m]] = places[s]
            m = after[m]
            continue
        for t in range(s, own_end[m]):
            out[names[t]] = places[t]
        m += 1
    return out


def place_of(value: Any) -> str:
    """A device-map value as a fully qualified place (``0`` -> ``"npu:0"`` via the registry)."""
    return device_key(value, what="device-map value")


def expand(
    layout: Layout, device_map: Mapping[Any, Any]
) -> tuple[list[str | None], list[int], list[str], list[tuple[int, list[str]]]]:
    """Read ``device_map`` against ``layout``.

    Returns ``(places, coverage, problems, multiply_covered)``: the place of each tensor (the
    most specific key wins; ``None`` when no key covers it), how many keys cover each tensor,
    one line per bad key or value, and ``(tensor, keys)`` for tensors covered more than once.
    """
    n = len(layout.names)
    problems: list[str] = []
    spans: list[tuple[int, int, str, str]] = []
    modules, tensors = layout.module_index, layout.tensor_index
    for key, value in device_map.items():
        if not isinstance(key, str):
            problems.append(f"key {key!r} is not a string (keys are module or parameter names)")
            continue
        m = modules.get(key)
        if m is not None:
            a, b = layout.start[m], layout.end[m]
        else:
            t = tensors.get(key)
            if t is None:
                problems.append(
                    f"key {key!r} names no module, parameter or buffer of {type(layout.model).__name__}"
                )
                continue
            a, b = t, t + 1
        try:
            place = place_of(value)
        except (ValueError, TypeError) as exc:
            problems.append(f"value of {key!r}: {exc}")
            continue
        spans.append((a, b, key, place))
    coverage_delta = [0] * (n + 1)
    for a, b, _, _ in spans:
        coverage_delta[a] += 1
        coverage_delta[b] -= 1
    coverage = [0] * n
    running = 0
    for t in range(n):
        running += coverage_delta[t]
        coverage[t] = running
    places: list[str | None] = [None] * n
    # Outer keys first, so that a more specific key overrides (for reporting only: overlap is
    # itself a violation).
    for a, b, _, place in sorted(spans, key=lambda s: s[0] - s[1]):
        places[a:b] = [place] * (b - a)
    multiple: list[tuple[int, list[str]]] = []
    if any(c > 1 for c in coverage):
        for t in [t for t in range(n) if coverage[t] > 1][:_SHOWN]:
            multiple.append((t, [k for a, b, k, _ in spans if a <= t < b]))
    return places, coverage, problems, multiple
