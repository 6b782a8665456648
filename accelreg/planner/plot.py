"""Per-place memory bars for a plan (matplotlib, imported only here)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ..sizes import format_size
from .plan import Plan
from .report import layer_ranges

__all__ = ["plot_plan"]


def plot_plan(plan: Plan, path: str | Path, *, title: str = "") -> Path:
    """Draw one bar per place (used, headroom, budget) labelled with its layer ranges; save to
    ``path`` (``.png`` or ``.svg``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    places = plan.places
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.7 * len(places)))
    scale = 1e6
    for i, usage in enumerate(places):
        y = len(places) - 1 - i
        budget = usage.budget if usage.budget is not None else usage.used + usage.headroom
        ax.barh(y, budget / scale, color="none", edgecolor="0.4", linewidth=1)
        ax.barh(
            y, usage.used / scale, color="tab:blue" if usage.place not in ("cpu", "disk") else "tab:orange"
        )
        if usage.headroom:
            ax.barh(
                y,
                usage.headroom / scale,
                left=usage.used / scale,
                color="none",
                edgecolor="tab:red",
                hatch="//",
            )
        label = ", ".join(layer_ranges(usage.keys)) or "(empty)"
        text = f"{format_size(usage.used)} / {format_size(budget)}  {textwrap.shorten(label, 90)}"
        ax.text(0, y + 0.42, text, va="bottom", fontsize=8)
    ax.set_yticks(range(len(places)), [u.place for u in reversed(places)])
    ax.set_xlabel("MB")
    ax.set_ylim(-0.6, len(places) - 0.1 + 0.4)
    ax.set_title(title or f"device map ({plan.strategy})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
