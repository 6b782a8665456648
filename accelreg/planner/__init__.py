"""Tied-weight-aware device-map planner: ``plan_device_map`` and ``check_device_map``.

Three ways in: :func:`plan_device_map` (the contract: a map for a model you hold),
:func:`plan` (the same plan with its whole report, a :class:`Plan`: per-place usage and
headroom, the main device, notes), and :func:`accelreg.meta.device_map_for` one layer up (the
patch-free path: builds the model on meta from a config, type or folder, then plans).

The pieces, one job each: :mod:`~.layout` (the model as tensors, atoms and units),
:mod:`~.budgets` (``max_memory`` or the registry), :mod:`~.quantization` (bitsandbytes sizes and
pins), :mod:`~.packing` (placing units), :mod:`~.maps` (writing and reading maps),
:mod:`~.check` (violations), :mod:`~.plan` (the public functions), :mod:`~.report` and
:mod:`~.plot` (summaries for people). See docs/planner.md.
"""

from __future__ import annotations

from .budgets import RESERVE, registry_budgets
from .plan import STRATEGIES, PlaceUsage, Plan, check_device_map, no_split_classes, plan, plan_device_map

__all__ = [
    "RESERVE",
    "STRATEGIES",
    "PlaceUsage",
    "Plan",
    "check_device_map",
    "default_max_memory",
    "no_split_classes",
    "plan",
    "plan_device_map",
]


def default_max_memory() -> dict[str, int]:
    """This machine's budgets as ``plan_device_map(max_memory=None)`` uses them: each available
    accelerator's free memory and the host's available memory, less :data:`RESERVE`; no disk."""
    return registry_budgets().as_dict()
