"""Per-place memory bars for a plan (matplotlib, imported only here).

One row per place, in the table's order: a filled bar for what the plan places there (blue on
an accelerator, orange on the cpu, brown on disk), a red hatched bar for the headroom the place
keeps *reserved* (not free: the main device runs the largest offloaded layer in it, the cpu
stages the largest disk-offloaded layer), and an outline for the budget. Each row's label (used /
budget and the layer ranges) sits in its own band above the bar, and the legend below the axes,
so that nothing overlaps however many places there are.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ..sizes import format_size
from .plan import Plan
from .report import layer_ranges

__all__ = ["figure", "plot_plan"]

#: Fill colours by kind of place; the legend explains them.
COLOURS = {"accelerator": "tab:blue", "cpu": "tab:orange", "disk": "tab:brown"}
HEADROOM = {"facecolor": "white", "edgecolor": "tab:red", "hatch": "//"}
_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B"))
#: Figure width (inches) and the characters of a row label that fit in it at 8 pt.
_WIDTH, _LABEL_CHARS = 10.0, 120
#: Inches per row: a label band above a bar.
_ROW = 0.62
#: The budget outline is clipped at this multiple of the largest thing drawn: a 1 TB disk
#: budget beside 20 GB accelerators would squash every bar.
_CLIP = 1.25


def _kind(place: str) -> str:
    return place if place in ("cpu", "disk") else "accelerator"


def _unit(largest: float) -> tuple[float, str]:
    return next(((scale, name) for scale, name in _UNITS if largest >= scale), (1.0, "B"))


def figure(plan: Plan, *, title: str = "") -> Any:
    """The plan's bar chart as a matplotlib ``Figure`` (not saved; see :func:`plot_plan`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    places = plan.places
    rows = max(len(places), 1)
    fig = Figure(figsize=(_WIDTH, 1.5 + _ROW * rows), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot, no GUI backend: the figure draws itself
    ax = fig.add_subplot()
    drawn = [u.used + u.headroom for u in places]
    drawn += [u.budget for u in places if u.budget is not None and _kind(u.place) == "accelerator"]
    largest = max(drawn, default=0) or 1
    scale, unit = _unit(largest)
    limit = largest * _CLIP / scale
    bar = 0.42  # bar height in row units; the label band is the rest of the row, above it
    kinds = set()
    for i, usage in enumerate(places):
        y = rows - 1 - i
        if usage.used:
            kinds.add(_kind(usage.place))
        budget = usage.budget if usage.budget is not None else usage.used + usage.headroom
        clipped = budget / scale > limit
        ax.barh(y, min(budget / scale, limit), height=bar, color="white", edgecolor="0.45", linewidth=1)
        ax.barh(y, usage.used / scale, height=bar, color=COLOURS[_kind(usage.place)])
        if usage.headroom:
            ax.barh(y, usage.headroom / scale, height=bar, left=usage.used / scale, linewidth=1, **HEADROOM)
        if clipped:  # the outline goes on beyond the axis
            ax.text(limit, y, "\u00bb ", ha="right", va="center", fontsize=11, color="0.35")
        label = ", ".join(layer_ranges(usage.keys)) or "(nothing placed)"
        size = f"{format_size(usage.used)} of {format_size(budget)}"
        if usage.headroom:
            size += f", {format_size(usage.headroom)} reserved"
        if clipped:
            size += " (budget outline clipped)"
        text = textwrap.shorten(f"{size}  |  {label}", _LABEL_CHARS, placeholder=" ...")
        ax.text(0, y + bar / 2 + 0.06, text, va="bottom", ha="left", fontsize=8, clip_on=True)
    ax.set_yticks(range(rows), [u.place for u in reversed(places)] or [""])
    ax.set_ylim(-0.5, rows - 0.5 + 0.12)
    ax.set_xlim(0, limit)
    ax.set_xlabel(unit)
    ax.spines[["top", "right"]].set_visible(False)
    resident = f"on accelerators: {format_size(plan.resident)} of {format_size(plan.total)}"
    ax.set_title(f"{title or 'device map'} ({plan.strategy}); {resident}", fontsize=10)
    handles = [
        Patch(facecolor=COLOURS["accelerator"], label="placed on an accelerator"),
        Patch(facecolor=COLOURS["cpu"], label="offloaded to the cpu"),
        Patch(facecolor=COLOURS["disk"], label="offloaded to disk"),
        Patch(label="headroom: reserved (not free) to run or stage the largest offloaded layer", **HEADROOM),
        Patch(facecolor="white", edgecolor="0.45", label="budget (max_memory)"),
    ]
    shown = [h for h in handles[:3] if h.get_label().split()[-1] in kinds]
    if any(u.headroom for u in places):
        shown.append(handles[3])
    shown.append(handles[4])
    # below the x axis, outside it (constrained layout makes room): never over a bar or label
    fig.legend(handles=shown, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return fig


def plot_plan(plan: Plan, path: str | Path, *, title: str = "") -> Path:
    """Draw one bar per place (used, reserved headroom, budget) labelled with its layer ranges,
    with a legend; save to ``path`` (``.png`` or ``.svg``)."""
    path = Path(path)
    fig = figure(plan, title=title)
    fig.savefig(path, bbox_inches="tight", dpi=100)
    return path
