"""Property-based tests: random module trees, ties, buffers, no-split classes and budgets.

Every map the planner returns passes ``check_device_map`` and an independent oracle, and keeps
exactly as many bytes on accelerators as the best map a brute force over every assignment and
every main device finds; when the planner says "does not fit", the brute force agrees, and when
the brute force finds a fit, so does the planner.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import accelreg
from accelreg.planner import packing, plan

from ._planner_support import atoms, brute_force, most_resident, oracle_valid, violations
from .test_planner_reference import exhaustive, holds

# Sibling names chosen so that string tests go wrong: "h.1" is a string prefix of "h.10",
# "head" a substring of "lm_head".
NAMES = ["h", "1", "10", "11", "head", "lm_head", "a", "ab"]


class Plain(nn.Module):
    pass


class Block(nn.Module):
    """The no-split class of the random trees."""


@st.composite
def trees(draw, depth: int = 0):
    n_children = draw(st.integers(0, 3 if depth < 2 else 0))
    names = draw(st.lists(st.sampled_from(NAMES), min_size=n_children, max_size=n_children, unique=True))
    children = [(name, draw(trees(depth + 1))) for name in names]
    leaf = not children
    params = draw(st.lists(st.integers(1, 6), min_size=1 if leaf else 0, max_size=2))
    buffers = draw(st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=1))
    block = draw(st.booleans()) if depth > 0 else False
    return {"params": params, "buffers": buffers, "children": children, "block": block}


def build(spec) -> nn.Module:
    with torch.device("meta"):
        module = (Block if spec["block"] else Plain)()
        for i, numel in enumerate(spec["params"]):
            module.register_parameter(f"w{i}", nn.Parameter(torch.empty(numel)))
        for i, (numel, persistent) in enumerate(spec["buffers"]):
            module.register_buffer(f"b{i}", torch.empty(numel), persistent=persistent)
        for name, child in spec["children"]:
            module.add_module(name, build(child))
    return module


def params_of(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    out = []
    for path, module in model.named_modules():
        for name in list(module._parameters):
            out.append((module, name, f"{path}.{name}" if path else name))
    return out


@st.composite
def scenarios(draw):
    model = build(draw(trees()))
    params = params_of(model)
    # identity ties: 2- or 3-way groups, anywhere (same module, siblings, distant subtrees)
    ties_n = draw(st.integers(0, 2)) if len(params) >= 2 else 0
    used: set[int] = set()
    for _ in range(ties_n):
        free = [i for i in range(len(params)) if i not in used]
        if len(free) < 2:
            break
        group = draw(st.lists(st.sampled_from(free), min_size=2, max_size=min(3, len(free)), unique=True))
        used.update(group)
        owner, name, _ = params[group[0]]
        shared = owner._parameters[name]
        for i in group[1:]:
            module, pname, _ = params[i]
            setattr(module, pname, shared)
    # a declared (caller) tie between two distinct parameters of equal size
    caller: list[list[str]] = []
    distinct = {}
    for module, name, full in params_of(model):
        p = module._parameters[name]
        distinct.setdefault(id(p), (full, p.numel()))
    by_size: dict[int, list[str]] = {}
    for full, numel in distinct.values():
        by_size.setdefault(numel, []).append(full)
    pairs = [names for names in by_size.values() if len(names) >= 2]
    if pairs and draw(st.booleans()):
        caller.append(draw(st.sampled_from(pairs))[:2])
    total = sum(t.numel() * 4 for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())

    def share(top: int) -> int:  # a budget as a share of the model (percent), in whole float32 elements
        percent = draw(st.one_of(st.integers(0, top), st.integers(top // 3, top)))
        return 4 * ((total // 4 * percent + 50) // 100)

    k = draw(st.integers(0, 3))
    budgets = {f"npu:{i}": share(150) for i in range(k)}
    if draw(st.booleans()) or k == 0:
        budgets["cpu"] = share(120)
    if draw(st.integers(0, 3)) == 0:
        budgets["disk"] = share(150)
    strategy = draw(st.sampled_from(["balanced", "balanced_low_0", "sequential"]))
    return model, caller, budgets, strategy


NO_SPLIT = frozenset({"Block"})


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(scenarios())
def test_every_plan_is_valid_optimal_and_no_fit_agrees_with_brute_force(case):
    model, caller, budgets, strategy = case
    if len(atoms(model, NO_SPLIT)) > 8:
        return  # brute force stays cheap; the trees are drawn small enough that this is rare
    try:
        result = plan(
            model, budgets, no_split_module_classes=["Block"], strategy=strategy, tied_parameters=caller
        )
    except accelreg.DeviceMapError as exc:
        assert exc.violations, "a no-fit error says where and by how much"
        assert "search limit" not in str(exc), "a few units never exhaust the search"
        found = brute_force(model, budgets, NO_SPLIT, caller)
        assert found is None, f"planner found no fit, brute force found {found} for {budgets}"
        return
    device_map = result.device_map
    best = most_resident(model, budgets, NO_SPLIT, caller)
    assert best is not None, f"the brute force finds no valid map, the planner did: {device_map}"
    assert result.optimal is not False, "a few units never exhaust the search"
    assert result.resident == best[0], (result.resident, best, device_map, budgets)
    assert (
        violations(model, device_map, budgets, no_split_module_classes=["Block"], tied_parameters=caller)
        == ()
    )
    assert all(v in budgets for v in device_map.values())
    assert oracle_valid(model, device_map, budgets, NO_SPLIT, caller), (device_map, budgets)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_brute_force_maps_pass_the_checker(case):
    """The oracle and check_device_map agree on what is valid (so neither is vacuous)."""
    model, caller, budgets, _ = case
    if len(atoms(model, NO_SPLIT)) > 7:
        return
    found = brute_force(model, budgets, NO_SPLIT, caller)
    if found is not None:
        assert (
            violations(model, found, budgets, no_split_module_classes=["Block"], tied_parameters=caller) == ()
        )


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_maps_cover_every_tensor_exactly_once_and_keep_ties(case):
    model, caller, _, strategy = case
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    # one device per leaf-ish piece: many small devices force splits everywhere
    budgets = {f"npu:{i}": 10**6 for i in range(6)}
    budgets["cpu"] = 10**6
    device_map = plan(
        model, budgets, no_split_module_classes=["Block"], strategy=strategy, tied_parameters=caller
    ).device_map
    for name in names:
        covering = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
        assert len(covering) == 1, (name, covering)
    place = {}
    for name in names:
        key = next(k for k in device_map if k == "" or name == k or name.startswith(k + "."))
        place[name] = device_map[key]
    by_object: dict[int, set[str]] = {}
    for n, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        by_object.setdefault(id(t), set()).add(place[n])
    assert all(len(p) == 1 for p in by_object.values())
    for group in caller:
        assert len({place[n] for n in group}) == 1


def test_tied_tensors_in_prefix_sharing_siblings_are_found_by_identity():
    """h.1 / h.10 / head / lm_head: membership by tree position, never by string."""
    with torch.device("meta"):
        root = Plain()
        root.h = nn.ModuleDict({"1": nn.Linear(4, 4), "10": nn.Linear(4, 4)})
        root.head = nn.Linear(4, 4)
        root.lm_head = nn.Linear(4, 4, bias=False)
    root.lm_head.weight = root.h["10"].weight
    budgets = {"npu:0": 4 * 24, "npu:1": 4 * 24, "cpu": 4 * 100}
    device_map = accelreg.plan_device_map(root, budgets, strategy="sequential")
    assert violations(root, device_map, budgets) == ()
    place = plan(root, budgets, strategy="sequential").places
    assert sum(u.used for u in place) == 4 * 20 * 3  # the shared weight counted once


# -- the packing core against exhaustive enumeration ---------------------------------------
@st.composite
def problems(draw):
    """Units (size, largest layer, offload rights), accelerators, cpu and disk budgets."""
    n = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    layers = [draw(st.integers(min(1, s), s)) for s in sizes]
    k = draw(st.integers(0, 3))
    return packing.Problem(
        sizes=sizes,
        layers=layers,
        blocks=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        cpu_ok=[True] * n if draw(st.booleans()) else draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        disk_ok=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        caps=draw(st.lists(st.integers(0, 24), min_size=k, max_size=k)),
        cpu=draw(st.one_of(st.none(), st.integers(0, 30))),
        disk=draw(st.one_of(st.none(), st.none(), st.integers(0, 30))),
        strategy=draw(st.sampled_from(packing.STRATEGIES)),
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_solver_keeps_the_most_bytes_any_placement_can(p):
    """Most accelerator-resident bytes, with the main device chosen: equal to an exhaustive
    enumeration of every placement and main device (test_planner_reference.exhaustive)."""
    exact = exhaustive(p)
    best = None if exact is None else exact[0]
    try:
        solution = packing.solve(p)
    except packing.NoFit as exc:
        assert exc.gave_up is None, "a few units never exhaust the search"
        assert best is None, f"no fit claimed, but {best} bytes can stay on accelerators"
        return
    assert not packing.validate(p, solution.targets, solution.main), solution
    assert holds(p, solution.targets, solution.main)
    resident = sum(s for s, t in zip(p.sizes, solution.targets, strict=True) if t < p.k)
    assert resident == best, (resident, best, solution)
    assert solution.optimal is not False


@pytest.mark.parametrize(
    "p",
    [
        packing.Problem(
            sizes=[0, 0, 0, 0],
            layers=[0, 0, 0, 0],
            blocks=[False] * 4,
            cpu_ok=[False] * 4,
            disk_ok=[False] * 4,
            caps=[1, 0],
            cpu=None,
            disk=None,
            strategy="balanced_low_0",
        ),
        packing.Problem(
            sizes=[11, 0],
            layers=[10, 0],
            blocks=[False, True],
            cpu_ok=[False, False],
            disk_ok=[True, True],
            caps=[5, 0],
            cpu=None,
            disk=None,
            strategy="balanced_low_0",
        ),
    ],
)
def test_balanced_low_0_keeps_weightless_units_off_a_device_without_a_budget(p):
    """Found by the property test above (issue 21's full run): balanced_low_0 counted a device
    without a budget as room for weightless units, then spread over the budgeted ones only and
    lost them ("contiguous segmentation lost units")."""
    try:
        solution = packing.solve(p)
    except packing.NoFit:
        assert exhaustive(p) is None
        return
    assert not packing.validate(p, solution.targets, solution.main)
    assert 1 not in solution.targets  # device 1 has no budget
