"""``plan_device_map`` and ``check_device_map``: analyse the model, solve, write the map.

:func:`plan` returns a :class:`Plan` (the map plus what is on each place and why);
:func:`plan_device_map` returns just the map. :func:`check_device_map` builds the same layout
and reports every rule a given map breaks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceMapError
from ..sizes import format_size
from . import check, packing
from .budgets import Budgets, parse_budgets, registry_budgets
from .dtypes import parse_dtype
from .layout import Layout, declared_ties
from .maps import emit
from .quantization import apply_quantization, detect_method

__all__ = [
    "STRATEGIES",
    "PlaceUsage",
    "Plan",
    "analyze",
    "check_device_map",
    "no_split_classes",
    "plan",
    "plan_device_map",
]

#: Accepted ``strategy`` words (transformers' ``device_map`` words) and the packing each means:
#: ``"auto"`` is balanced, as in transformers.
STRATEGIES: dict[str, str] = {"auto": "balanced", **{name: name for name in packing.STRATEGIES}}


@dataclass
class PlaceUsage:
    """What one place holds in a plan."""

    place: str
    used: int
    budget: int | None
    headroom: int = 0
    keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "place": self.place,
            "used": self.used,
            "budget": self.budget,
            "headroom": self.headroom,
            "keys": list(self.keys),
        }


@dataclass
class Plan:
    """A device map and what it puts where."""

    device_map: dict[str, str]
    places: list[PlaceUsage]
    total: int
    strategy: str
    budgets: Budgets
    method: str = "contiguous"
    quantization: str | None = None
    dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    layout: Layout | None = field(default=None, repr=False)
    #: The accelerator that runs offloaded layers (the map's first accelerator), or ``None``.
    main_device: str | None = None
    #: ``True``: no valid map keeps more bytes on the accelerators (then fewer on disk);
    #: ``False``: the search stopped at its limit first; ``None``: nothing is offloaded.
    optimal: bool | None = None
    #: The packing problem the map solves (units in forward order), for explanations.
    problem: packing.Problem | None = field(default=None, repr=False)
    #: ``True``: every accelerator the map uses keeps the offload headroom, so the map holds
    #: whichever of them runs the offloaded layers (stock dispatch; :func:`accelreg.device_map_for`).
    any_main: bool = False

    @property
    def resident(self) -> int:
        """Bytes on accelerators."""
        return sum(u.used for u in self.places if u.place not in ("cpu", "disk"))

    @property
    def resident_share(self) -> float:
        """Share of the model's bytes on accelerators (1.0 for an empty model)."""
        return self.resident / self.total if self.total else 1.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data (what ``accelreg plan --json`` prints)."""
        return {
            "device_map": dict(self.device_map),
            "places": [p.as_dict() for p in self.places],
            "total": self.total,
            "resident": self.resident,
            "resident_share": self.resident_share,
            "main_device": self.main_device,
            "any_main": self.any_main,
            "optimal": self.optimal,
            "strategy": self.strategy,
            "method": self.method,
            "quantization": self.quantization,
            "dtype": self.dtype,
            "budgets": self.budgets.as_dict(),
            "budget_source": self.budgets.source,
            "notes": list(self.notes),
        }


def _strategy(strategy: Any) -> str:
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return STRATEGIES[strategy]
    raise DeviceMapError(
        f"unknown strategy {strategy!r}; accepted: {', '.join(STRATEGIES)} ('auto' is 'balanced', as in transformers)"
    )


def no_split_classes(model: Any, device_map: Any = None) -> list[str]:
    """The module classes ``model`` says must never be split across devices, sorted.

    With a ``device_map`` word (``"auto"``) and a model that has transformers'
    ``_get_no_split_modules`` (4.57-5.3; it also collects the classes of sub-models), that is
    asked, as transformers asks it when it plans; otherwise the model's ``_no_split_modules``.
    """
    getter = getattr(model, "_get_no_split_modules", None)
    if device_map is not None and callable(getter):
        return sorted(getter(device_map) or ())
    return sorted(getattr(model, "_no_split_modules", None) or ())


def _no_split(model: Any, given: Any) -> frozenset[str]:
    if given is None:
        given = no_split_classes(model)
    if isinstance(given, str):
        given = [given]
    names = list(given)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"no_split_module_classes holds {name!r}; give class names as strings")
    return frozenset(names)


def _caller_ties(tied_parameters: Any) -> list[list[str]]:
    if tied_parameters is None:
        return []
    groups = []
    for group in tied_parameters:
        if isinstance(group, str) or not isinstance(group, Iterable):
            raise TypeError(
                "tied_parameters is a list of lists of parameter names, e.g. [['wte.weight', 'lm_head.weight']]"
            )
        names = list(group)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"tied_parameters group {names!r} holds a non-string")
        groups.append(names)
    return groups


def analyze(
    model: Any,
    *,
    no_split_module_classes: Any = None,
    dtype: Any = None,
    tied_parameters: Any = None,
    quantization: Any = None,
    backend: str = "cpu",
) -> tuple[Layout, str | None, list[list[str]]]:
    """The planner's view of ``model``: ``(layout, quantization method, every tie group)``."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    resolved = parse_dtype(dtype, model)
    layout = Layout(model, no_split=_no_split(model, no_split_module_classes), dtype=resolved)
    if resolved is torch.float16:
        layout.keep_fp32(
            [
                *(getattr(model, "_keep_in_fp32_modules", None) or ()),
                *(getattr(model, "_keep_in_fp32_modules_strict", None) or ()),
            ]
        )
    elif resolved is torch.bfloat16:
        layout.keep_fp32(list(getattr(model, "_keep_in_fp32_modules_strict", None) or ()))
    method, why = detect_method(model, layout, quantization)
    if method is not None:
        apply_quantization(model, layout, method, backend, replaced_only=why.endswith("modules in the model"))
    declared = [list(pair) for pair in declared_ties(model)]
    caller = _caller_ties(tied_parameters)
    layout.build(declared, strict_names=caller)
    return layout, method, declared + caller


def plan(
    model: Any,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    no_split_module_classes: Sequence[str] | None = None,
    strategy: str = "balanced",
    dtype: Any = None,
    tied_parameters: Sequence[Sequence[str]] | None = None,
    quantization: str | None = None,
    search_limit: int | None = None,
    any_main: bool = False,
) -> Plan:
    """Plan a device map and report what goes where (see :func:`plan_device_map`).

    With ``any_main``, once something is offloaded every accelerator the map uses keeps the
    headroom for the largest offloaded layer, not only the main device: the map is then valid
    whichever of them runs the offloaded layers, as stock accelerate (1.15+) picks one by hash
    order when ``from_pretrained(device_map=...)`` dispatches without accelreg's patches. It
    can keep fewer bytes on the accelerators (docs/planner.md says how many)."""
    if search_limit is not None and (
        isinstance(search_limit, bool) or not isinstance(search_limit, int) or search_limit < 1
    ):
        raise ValueError(f"search_limit must be a positive int (search nodes), not {search_limit!r}")
    strategy = _strategy(strategy)
    budgets = registry_budgets() if max_memory is None else parse_budgets(max_memory)
    layout, method, _ = analyze(
        model,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        tied_parameters=tied_parameters,
        quantization=quantization,
        backend=budgets.backend,
    )
    caps = [c for _, c in budgets.accelerators]
    problem = packing.Problem(
        sizes=layout.unit_size,
        layers=layout.unit_layer,
        blocks=layout.unit_block,
        cpu_ok=layout.unit_cpu_ok,
        disk_ok=layout.unit_disk_ok,
        caps=caps,
        cpu=budgets.cpu,
        disk=budgets.disk,
        strategy=strategy,
        any_main=bool(any_main),
    )
    try:
        solution = packing.solve(problem, search_limit)
    except packing.NoFit as exc:
        raise _no_fit(layout, budgets, problem, method, exc) from None
    k = len(caps)
    names = [d for d, _ in budgets.accelerators] + ["cpu", "disk"]
    unit_place = [names[t] for t in solution.targets]
    atom_unit, tensor_atom = layout.atom_unit, layout.tensor_atom
    places = [unit_place[atom_unit[tensor_atom[t]]] for t in range(len(layout.names))]
    main = None if solution.main is None or any_main else names[solution.main]
    device_map = emit(layout, places, main=main)
    usage = _usage(layout, device_map, places, budgets, any_main=bool(any_main))
    leftover = packing.validate(problem, solution.targets, solution.main)
    if leftover:  # pragma: no cover - the solver only returns valid placements
        raise AssertionError(f"planner produced an invalid placement: {leftover}")
    notes = list(solution.notes)
    if k and not any(u.used for u in usage if u.place not in ("cpu", "disk")):
        notes.append(
            "no accelerator holds anything: a layer that must be offloaded needs more headroom than any accelerator has"
        )
    return Plan(
        device_map=device_map,
        places=usage,
        total=layout.total,
        strategy=strategy,
        budgets=budgets,
        method=solution.method,
        quantization=method,
        dtype=None if layout.dtype is None else str(layout.dtype).removeprefix("torch."),
        notes=notes,
        layout=layout,
        main_device=check.main_device(device_map) if any(t >= k for t in solution.targets) else None,
        optimal=solution.optimal,
        problem=problem,
        any_main=bool(any_main),
    )


def _usage(
    layout: Layout, device_map: dict[str, str], places: list[str | None], budgets: Budgets, *, any_main: bool
) -> list[PlaceUsage]:
    used = check.loads(layout, places)
    room = check.headroom(layout, device_map, places, any_main=any_main)
    caps = budgets.as_dict()
    keys: dict[str, list[str]] = {}
    for key, place in device_map.items():
        keys.setdefault(place, []).append(key)
    order = [d for d, _ in budgets.accelerators] + ["cpu", "disk"]
    order += [p for p in used if p not in order]
    return [
        PlaceUsage(p, used.get(p, 0), caps.get(p), room.get(p, (0, ""))[0], keys.get(p, []))
        for p in order
        if p in caps or p in used
    ]


def _no_fit(
    layout: Layout, budgets: Budgets, problem: packing.Problem, method: str | None, exc: packing.NoFit
) -> DeviceMapError:
    total = layout.total
    caps = budgets.as_dict()
    capacity = sum(caps.values())
    shown = ", ".join(f"{p} {format_size(c)}" for p, c in caps.items()) or "none"
    lines = []
    if total > capacity:
        lines.append(
            f"the model needs {format_size(total)} but the budgets hold {format_size(capacity)} ({shown}): short by {format_size(total - capacity)}"
        )
    biggest_cap = max(caps.values(), default=0)
    for u in exc.failed[:5]:
        size = problem.sizes[u]
        allowed = [d for d, _ in budgets.accelerators]
        if problem.cpu_ok[u] and budgets.cpu is not None:
            allowed.append("cpu")
        if problem.disk_ok[u] and budgets.disk is not None:
            allowed.append("disk")
        room = max((caps[p] for p in allowed), default=0)
        what = f"unit {layout.unit_name(u)!r} ({format_size(size)})"
        if size > room:
            where = ", ".join(allowed) or "nowhere"
            lines.append(
                f"{what} fits on no place it may use ({where}; the largest budget among them is {format_size(room)}, short by {format_size(size - room)})"
            )
        else:
            lines.append(f"{what} found no room left on {', '.join(allowed) or 'any place'}")
    if len(exc.failed) > 5:
        lines.append(f"... and {len(exc.failed) - 5} more unit(s) like those")
    pinned = [u for u in range(len(problem.sizes)) if not problem.cpu_ok[u] and not problem.disk_ok[u]]
    if pinned:
        need = sum(problem.sizes[u] for u in pinned)
        acc = sum(problem.caps)
        rule = next(iter(layout.quantized.values()))[1] if layout.quantized else None
        provider = f" (rule from {rule.provider})" if rule is not None and rule.provider else ""
        lines.append(
            f"{len(pinned)} unit(s) hold {method} weights ({format_size(need)}), which the placement rule for backend "
            f"{budgets.backend!r}{provider} keeps off cpu and disk; the accelerators hold {format_size(acc)}"
            + (f": short by {format_size(need - acc)}" if need > acc else "")
        )
        free = [u for u in range(len(problem.sizes)) if problem.cpu_ok[u] or problem.disk_ok[u]]
        if need <= acc and free:
            largest = max(free, key=lambda u: problem.layers[u])
            lines.append(
                f"the other units then go to cpu/disk, and the main device must also keep headroom for the "
                f"largest of them ({layout.unit_name(largest)!r}, {format_size(problem.layers[largest])})"
            )
    off_layer = max(problem.layers, default=0)
    if (
        problem.caps
        and (budgets.cpu is not None or budgets.disk is not None)
        and off_layer > max(problem.caps)
    ):
        lines.append(
            f"offloading a layer needs headroom for it on the main device; the largest layer is {format_size(off_layer)}, "
            f"the largest accelerator budget {format_size(max(problem.caps))}"
        )
    if not lines:
        lines = list(exc.reasons)
    summary = f"cannot place the model ({format_size(total)}) within max_memory ({shown})"
    if exc.gave_up is not None and total <= capacity and biggest_cap:
        lines.append(
            f"the search stopped at its limit of {exc.gave_up:,} nodes before finding a placement; "
            f"raise it with accelreg.planner.plan(..., search_limit={10 * exc.gave_up}) "
            f"(or plan_device_map(..., search_limit=...), accelreg plan --search-limit {10 * exc.gave_up})"
        )
        return DeviceMapError(
            f"no plan found within the search limit ({exc.gave_up:,} nodes) for the model ({format_size(total)}) "
            f"within max_memory ({shown}); a placement may exist: raise search_limit",
            lines,
        )
    if total > capacity:
        summary += f": short by {format_size(total - capacity)}"
    elif biggest_cap == 0:
        summary += ": every budget is 0"
    else:
        summary += (
            f": the budgets add up to {format_size(capacity)}, but no placement keeps every unit whole "
            "within them (with offload headroom)"
        )
    return DeviceMapError(summary, lines)


def plan_device_map(
    model: Any,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    no_split_module_classes: Sequence[str] | None = None,
    strategy: str = "balanced",
    dtype: Any = None,
    tied_parameters: Sequence[Sequence[str]] | None = None,
    quantization: str | None = None,
    search_limit: int | None = None,
) -> dict[str, str]:
    """A device map for ``model`` (normally on the meta device) within ``max_memory``.

    Args:
        model: Any ``torch.nn.Module``; registration order is taken as forward order.
        max_memory: ``{"npu:0": "20GiB", 1: 20 * 2**30, "cpu": "64GiB", "disk": "1TB"}``. Fully
            qualified keys are taken as given (no registry lookup); bare ints resolve through
            the registry. ``None``: this machine's free memory less a 10 % reserve, then the cpu.
        no_split_module_classes: Class names never split across places (default: the model's
            ``_no_split_modules``).
        strategy: ``"balanced"`` (or ``"auto"``), ``"balanced_low_0"``, ``"sequential"``.
        dtype: The dtype floating weights will be loaded in (``torch.float16``, ``"bf16"``, ...).
        tied_parameters: Extra groups of tensor names that must share a place (and storage).
        quantization: ``"8bit"`` / ``"4bit"`` (bitsandbytes) to size and place the model as
            quantized; ``None`` detects it; ``False`` turns detection off.
        search_limit: Nodes the search for the most accelerator-resident map may visit once
            something must be offloaded (default ``accelreg.planner.residency.SEARCH_NODES``).

    Returns:
        Module (or tensor) names -> ``"npu:0"``, ``"cpu"`` or ``"disk"``.

    Raises:
        DeviceMapError: the model cannot fit (``violations`` says by how much and where), or a
            bad ``strategy``.
    """
    return plan(
        model,
        max_memory,
        no_split_module_classes=no_split_module_classes,
        strategy=strategy,
        dtype=dtype,
        tied_parameters=tied_parameters,
        quantization=quantization,
        search_limit=search_limit,
    ).device_map


def check_device_map(
    model: Any,
    device_map: Mapping[Any, Any],
    max_memory: Mapping[Any, Any] | None = None,
    *,
    no_split_module_classes: Sequence[str] | None = None,
    dtype: Any = None,
    tied_parameters: Sequence[Sequence[str]] | None = None,
    quantization: str | None = None,
    any_main: bool = False,
) -> None:
    """Raise :class:`~accelreg.DeviceMapError` naming every rule ``device_map`` breaks.

    Checks coverage (each parameter and persistent buffer exactly once), unknown keys, places,
    tied groups, no-split modules, modules' own tensors, quantized placements and, when
    ``max_memory`` is given, budgets with offload headroom: on the main device (the map's first
    accelerator), or with ``any_main`` on every accelerator the map uses (what a map needs for
    stock dispatch, which may run the offloaded layers on any of them). The other keyword-only
    arguments mean what they mean for :func:`plan_device_map`, so a plan can be checked under
    the same assumptions.
    """
    budgets = parse_budgets(max_memory) if max_memory is not None else None
    backend = _map_backend(device_map, budgets)
    layout, _, ties = analyze(
        model,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        tied_parameters=tied_parameters,
        quantization=quantization,
        backend=backend,
    )
    found = check.violations(layout, device_map, budgets, ties, any_main=any_main)
    if found:
        raise DeviceMapError(
            f"device map breaks {len(found)} rule(s): {found[0]}" + (" ..." if len(found) > 1 else ""), found
        )


def _map_backend(device_map: Any, budgets: Budgets | None) -> str:
    if budgets is not None and budgets.accelerators:
        return budgets.backend
    if isinstance(device_map, Mapping):
        main = check.main_device(device_map)
        if main is not None:
            return main.split(":", 1)[0]
    return "cpu"
