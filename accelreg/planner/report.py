"""Readable summaries of a plan: layer ranges (``transformer.h.0-5``) and table rows."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from ..sizes import format_size
from .maps import expand
from .plan import Plan

__all__ = ["layer_ranges", "quality", "rows"]

_NUMBERED = re.compile(r"(.*)\.([0-9]+)")


def layer_ranges(keys: Iterable[str]) -> list[str]:
    """Collapse runs of numbered siblings: ``h.0, h.1, h.2, ln_f`` -> ``h.0-2, ln_f``."""
    out: list[str] = []
    run: tuple[str, int, int] | None = None

    def flush() -> None:
        if run is not None:
            prefix, a, b = run
            out.append(f"{prefix}.{a}" if a == b else f"{prefix}.{a}-{b}")

    for key in keys:
        m = _NUMBERED.fullmatch(key)
        if m is not None:
            prefix, index = m.group(1), int(m.group(2))
            if run is not None and run[0] == prefix and run[2] + 1 == index:
                run = (prefix, run[1], index)
                continue
            flush()
            run = (prefix, index, index)
            continue
        flush()
        run = None
        out.append(key or "(whole model)")
    flush()
    return out


def rows(plan: Plan) -> list[list[str]]:
    """``[place, used, budget, headroom, share, layers]`` per place, for a table."""
    total = max(plan.total, 1)
    out = []
    for usage in plan.places:
        out.append(
            [
                usage.place,
                format_size(usage.used),
                "-" if usage.budget is None else format_size(usage.budget),
                format_size(usage.headroom) if usage.headroom else "-",
                f"{100 * usage.used / total:.0f}%",
                ", ".join(layer_ranges(usage.keys)) or "-",
            ]
        )
    return out


def quality(plan: Plan) -> dict[str, float | int]:
    """How balanced and contiguous a plan is.

    ``balance``: largest accelerator load / mean over the accelerators used. ``largest_unit``
    and ``largest_glued``: the largest indivisible unit, and the largest run of units the planner
    keeps together by preference (no cut between two plain leaves), each over the mean load.
    ``boundaries``: place changes along forward order; ``extra_boundaries``: those beyond one per
    additional device used (returns to an earlier device, e.g. for a tied head).
    """
    layout = plan.layout
    assert layout is not None
    accelerators = [u for u in plan.places if u.place not in ("cpu", "disk")]
    used = [u.used for u in accelerators if u.used]
    mean = sum(used) / len(used) if used else 0.0
    largest = max(layout.unit_size, default=0)
    glued = run = 0
    first = {a: u for u, atoms in enumerate(layout.unit_atoms) for a in atoms[:1]}
    order = [u for a, u in sorted(first.items())]
    for i, u in enumerate(order):
        cut = i == 0 or not any(layout.unit_block) or layout.unit_block[u] or layout.unit_block[order[i - 1]]
        run = layout.unit_size[u] if cut else run + layout.unit_size[u]
        glued = max(glued, run)
    places = expand(layout, plan.device_map)[0]
    sequence = [p for t, p in enumerate(places) if p is not None and layout.required[t]]
    boundaries = sum(1 for a, b in itertools.pairwise(sequence) if a != b)
    distinct = len(set(sequence))
    return {
        "balance": max(used) / mean if used else 0.0,
        "largest_unit": largest / mean if mean else 0.0,
        "largest_glued": glued / mean if mean else 0.0,
        "devices_used": len(used),
        "devices": len(accelerators),
        "boundaries": boundaries,
        "extra_boundaries": boundaries - (distinct - 1),
    }
