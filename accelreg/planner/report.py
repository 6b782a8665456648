"""Readable summaries of a plan: layer ranges (``transformer.h.0-5``), table rows, quality
figures, and why each offloaded unit could not stay on an accelerator."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from ..sizes import format_size
from . import packing, residency
from .maps import expand
from .plan import Plan

__all__ = ["explain", "layer_ranges", "quality", "rows"]

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


def explain(plan: Plan, search_limit: int | None = None) -> list[str]:
    """Lines saying how much the accelerators hold and why each offloaded unit could not stay.

    For each kind of offloaded unit (same size, largest layer and offload rights) the search is
    run again with one such unit kept on an accelerator: the most that map holds on the
    accelerators is the reason (or that no valid map keeps it). The room left on each
    accelerator and the main device's headroom are facts of the plan itself.
    """
    layout, problem = plan.layout, plan.problem
    assert layout is not None and problem is not None
    total, resident = plan.total, plan.resident
    lines = [f"accelerators hold {format_size(resident)} of {format_size(total)} ({_share(resident, total)})"]
    accelerators = [u for u in plan.places if u.place not in ("cpu", "disk")]
    places = expand(layout, plan.device_map)[0]
    first = [layout.atom_start[atoms[0]] for atoms in layout.unit_atoms]
    where = [places[t] for t in first]
    off = [u for u, place in enumerate(where) if place in ("cpu", "disk")]
    if not off:
        lines.append("nothing is offloaded")
        return lines
    lines[0] += f"; {format_size(total - resident)} offloaded ({len(off)} unit(s))"
    caps = [u.budget or 0 for u in accelerators]
    if not accelerators:
        lines.append("no accelerator budget: everything is on cpu/disk")
    elif plan.main_device is None:
        too_big = [u for u in off if problem.sizes[u] > max(caps)]
        if too_big:
            u = max(too_big, key=lambda u: problem.layers[u])
            lines.append(
                f"{layout.unit_name(u)!r} ({format_size(problem.sizes[u])}) fits no accelerator, so it is offloaded, "
                f"and a main device would need {format_size(problem.layers[u])} free to run it"
                + (": more than any accelerator budget" if problem.layers[u] > max(caps) else "")
            )
    else:
        usage = next(u for u in plan.places if u.place == plan.main_device)
        lines.append(
            f"main device {plan.main_device} (listed first in the map) keeps {format_size(usage.headroom)} "
            "free to run the offloaded layers, the largest of them"
        )
    if plan.optimal:
        lines.append("no valid map keeps more bytes on the accelerators (exact search)")
    elif plan.optimal is False:
        lines.append("the search stopped at its limit: a map keeping more may exist (raise search_limit)")
    free = {u.place: (u.budget or 0) - u.used - u.headroom for u in accelerators}
    roomiest = max(free, key=free.__getitem__) if free else None
    kinds: dict[tuple[int, int, bool, bool], list[int]] = {}
    for u in range(len(problem.sizes)):
        kinds.setdefault(
            (problem.sizes[u], problem.layers[u], problem.cpu_ok[u], problem.disk_ok[u]), []
        ).append(u)
    lines.append("offloaded:")
    for units in kinds.values():
        gone = [u for u in units if where[u] in ("cpu", "disk")]
        if not gone:
            continue
        names = ", ".join(layer_ranges(layout.unit_name(u) for u in gone))
        size = problem.sizes[gone[0]]
        each = " each" if len(gone) > 1 else ""
        placed = "/".join(sorted({where[u] for u in gone}))
        if not accelerators:
            why = "no accelerator budget"
        elif size > max(caps):
            why = "larger than any accelerator budget"
        else:
            kept = len(units) - len(gone)  # keep one more of this kind: which one does not matter
            why = f"the most room left on an accelerator is {format_size(max(free[roomiest], 0))} ({roomiest}); "
            why += _kept(problem, units[: kept + 1], resident, search_limit)
        lines.append(f"  {names} ({format_size(size)}{each}) on {placed}: {why}")
    return lines


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "100 %"


def _alone(problem: packing.Problem, u: int) -> bool:
    """Whether no other unit has the size, layer and offload rights of ``u``."""
    keys = list(zip(problem.sizes, problem.layers, problem.cpu_ok, problem.disk_ok, strict=True))
    return keys.count(keys[u]) == 1


def _kept(problem: packing.Problem, units: list[int], resident: int, search_limit: int | None) -> str:
    """What the best map keeping ``units`` on accelerators holds there."""
    cpu_ok = list(problem.cpu_ok)
    disk_ok = list(problem.disk_ok)
    for u in units:
        cpu_ok[u] = disk_ok[u] = False
    found = residency.search(
        problem.sizes,
        problem.layers,
        cpu_ok,
        disk_ok,
        problem.caps,
        problem.cpu,
        problem.disk,
        nodes=residency.SEARCH_NODES if search_limit is None else search_limit,
        any_main=problem.any_main,
    )
    what = "it" if len(units) == 1 and _alone(problem, units[0]) else f"{len(units)} of these"
    if found.counts is None:
        return f"no valid map keeps {what} on accelerators" + (
            " (within the search limit)" if found.cut else ""
        )
    lead = f"the best map keeping {what} on accelerators" + (
        " found within the search limit" if found.cut else ""
    )
    if found.resident >= resident:  # only when this plan is not the best
        return f"{lead} holds {format_size(found.resident)} there: this plan is not the best"
    return f"{lead} holds {format_size(resident - found.resident)} less there ({format_size(found.resident)})"
