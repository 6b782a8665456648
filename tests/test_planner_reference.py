"""An exact reference for the planner's objective: the most bytes accelerators can hold.

:func:`optimum` solves, as a small mixed-integer program (scipy's ``milp``, HiGHS), the
documented placement semantics with nothing of the planner's search in it:

* every unit (atoms joined by ties, see docs/planner.md) goes whole to an accelerator, the cpu or
  the disk (cpu/disk only with a budget, and only where its quantization rule allows);
* no place holds more than its budget;
* when anything is on cpu or disk and any accelerator is used, one used accelerator is the
  *main* device (any of them: the planner chooses it and writes it first in the map) and keeps
  headroom for the largest offloaded layer; the cpu keeps room for the largest disk layer.

Identical units (same size, largest layer and offload rights) are one integer variable per
place, so a 126-layer model is a few dozen variables. The objective is accelerator-resident
bytes; :func:`optimum` then also minimises disk bytes at that residency. Every answer is
re-checked in exact integer arithmetic by :func:`holds` (an independent reading of the rules),
so a solver tolerance can never pass off an invalid placement as the optimum.

The tests at the bottom pin the reference itself against an exhaustive enumeration.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from accelreg.planner import packing

#: Seconds per MILP, and the relative optimality gap it stops at; either way the solver's bound
#: is kept as an upper bound on the optimum.
TIME_LIMIT = 60
GAP = 1e-5
#: Assignments an exhaustive enumeration may try to settle a case the solver leaves open.
EXHAUSTIVE = 300_000


@dataclass
class Optimum:
    bound: int | None  # the solver's bound: no placement holds more
    resident: int
    disk: int
    targets: list[int] | None  # a target per unit: accelerator index, k (cpu) or k + 1 (disk)
    main: int | None
    upper: int = 0  # no placement keeps more bytes on the accelerators
    open: bool = False  # the truth lies between ``resident`` (a valid placement, if any) and ``upper``


def _classes(p: packing.Problem) -> tuple[list[tuple[int, int, bool, bool]], list[list[int]]]:
    groups: dict[tuple[int, int, bool, bool], list[int]] = {}
    for u in range(len(p.sizes)):
        key = (p.sizes[u], p.layers[u], bool(p.cpu_ok[u]), bool(p.disk_ok[u]))
        groups.setdefault(key, []).append(u)
    keys = list(groups)
    return keys, [groups[k] for k in keys]


def holds(p: packing.Problem, targets: Sequence[int], main: int | None) -> bool:
    """Whether ``targets`` obeys the rules with ``main`` as the main device (exact integers)."""
    k = p.k
    load = [0] * (k + 2)
    off = disk_layer = 0
    used = set()
    for u, t in enumerate(targets):
        load[t] += p.sizes[u]
        if t < k:
            used.add(t)
        else:
            if t == k and (p.cpu is None or not p.cpu_ok[u]):
                return False
            if t == k + 1 and (p.disk is None or not p.disk_ok[u]):
                return False
            off = max(off, p.layers[u])
            if t == k + 1:
                disk_layer = max(disk_layer, p.layers[u])
    if off and used and main not in used:
        return False
    for d in range(k):
        if load[d] + (off if d == main and off else 0) > p.caps[d]:
            return False
    if p.cpu is not None and load[k] + disk_layer > p.cpu:
        return False
    return not (p.disk is not None and load[k + 1] > p.disk)


@contextlib.contextmanager
def _no_stdout():
    """HiGHS prints debug lines to the process's stdout (file descriptor 1) at tight tolerances."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solve(
    p: packing.Problem, resident_at_least: int | None, margin: float = 0.0, presolve: bool = True
) -> Optimum | None:
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    k = p.k
    keys, members = _classes(p)
    C = len(keys)
    # headroom variables are in units of ``scale``; each budget row is divided by its own budget
    # (so the solver's tolerance is relative to it) and tightened by ``margin`` of it
    scale = float(max([*p.caps, p.cpu or 0, max(p.sizes, default=1), 1]))
    places = list(range(k))
    if p.cpu is not None:
        places.append(k)
    if p.disk is not None:
        places.append(k + 1)
    var: dict[tuple, int] = {}

    def new(name: tuple) -> int:
        var[name] = len(var)
        return var[name]

    for c, (_, _, cpu_ok, disk_ok) in enumerate(keys):
        for t in places:
            if (t == k and not cpu_ok) or (t == k + 1 and not disk_ok):
                continue
            new(("n", c, t))
        new(("z", c))  # some unit of class c is offloaded
        new(("w", c))  # some unit of class c is on disk
    for d in range(k):
        new(("u", d))  # accelerator d is used
        new(("y", d))  # accelerator d is the main device
        new(("h", d))  # headroom kept on d
    new(("hd",))  # headroom kept on the cpu for disk layers
    nv = len(var)
    lower = np.zeros(nv)
    upper = np.ones(nv)
    integrality = np.ones(nv)
    for name, i in var.items():
        if name[0] == "n":
            upper[i] = len(members[name[1]])
        elif name[0] in ("h", "hd"):
            upper[i] = np.inf
            integrality[i] = 0
    rows: list[tuple[dict[int, float], float, float]] = []

    def budget_row(bytes_of: dict[tuple, float], budget: int) -> tuple[dict[int, float], float, float]:
        norm = float(max(budget, min(p.sizes, default=1), 1))
        return {var[name]: v / norm for name, v in bytes_of.items()}, -np.inf, budget / norm - margin

    total = sum(len(m) for m in members)
    for c, (_, layer, _, _) in enumerate(keys):
        m = len(members[c])
        row = {var[("n", c, t)]: 1.0 for t in places if ("n", c, t) in var}
        rows.append((row, m, m))
        off = {var[("n", c, t)]: 1.0 for t in (k, k + 1) if ("n", c, t) in var}
        rows.append(({**off, var[("z", c)]: -m}, -np.inf, 0))
        if ("n", c, k + 1) in var:
            rows.append(({var[("n", c, k + 1)]: 1.0, var[("w", c)]: -m}, -np.inf, 0))
        else:
            upper[var[("w", c)]] = 0
        if not off:
            upper[var[("z", c)]] = 0
        for d in range(k):
            # anything offloaded while d is used: some accelerator is the main device
            rows.append(
                (
                    {var[("z", c)]: 1.0, var[("u", d)]: 1.0, **{var[("y", e)]: -1.0 for e in range(k)}},
                    -np.inf,
                    1,
                )
            )
            # the main device keeps headroom for the largest offloaded layer
            rows.append(
                (
                    {var[("h", d)]: 1.0, var[("z", c)]: -layer / scale, var[("y", d)]: -layer / scale},
                    -layer / scale,
                    np.inf,
                )
            )
        rows.append(({var[("hd",)]: 1.0, var[("w", c)]: -layer / scale}, 0, np.inf))
    for d in range(k):
        n_d = {var[("n", c, d)]: 1.0 for c in range(C)}
        rows.append(({**n_d, var[("u", d)]: -total}, -np.inf, 0))
        rows.append(({**n_d, var[("u", d)]: -1.0}, 0, np.inf))
        rows.append(({var[("y", d)]: 1.0, var[("u", d)]: -1.0}, -np.inf, 0))
        rows.append(budget_row({("n", c, d): keys[c][0] for c in range(C)} | {("h", d): scale}, p.caps[d]))
    rows.append(({var[("y", d)]: 1.0 for d in range(k)}, -np.inf, 1))
    # symmetry: accelerators with equal budgets are interchangeable, so the main device is the
    # first of its group and the others hold non-increasing loads
    groups: dict[int, list[int]] = {}
    for d in range(k):
        groups.setdefault(p.caps[d], []).append(d)
    for same in groups.values():
        for e in same[1:]:
            upper[var[("y", e)]] = 0
        for a, b in itertools.pairwise(same[1:]):
            row = {var[("n", c, a)]: keys[c][0] / scale for c in range(C)}
            for c in range(C):
                row[var[("n", c, b)]] = row.get(var[("n", c, b)], 0) - keys[c][0] / scale
            rows.append((row, 0, np.inf))
    if p.cpu is not None:
        load = {("n", c, k): keys[c][0] for c in range(C) if ("n", c, k) in var}
        rows.append(budget_row({**load, ("hd",): scale}, p.cpu))
    if p.disk is not None:
        load = {("n", c, k + 1): keys[c][0] for c in range(C) if ("n", c, k + 1) in var}
        if load:
            rows.append(budget_row(load, p.disk))
    resident = np.zeros(nv)
    disk = np.zeros(nv)
    for c in range(C):
        for d in range(k):
            resident[var[("n", c, d)]] = keys[c][0] / scale
        if ("n", c, k + 1) in var:
            disk[var[("n", c, k + 1)]] = keys[c][0] / scale
    if resident_at_least is not None:
        rows.append(
            ({i: resident[i] for i in range(nv) if resident[i]}, (resident_at_least - 0.5) / scale, np.inf)
        )
    A = np.zeros((len(rows), nv))
    lo = np.empty(len(rows))
    hi = np.empty(len(rows))
    for r, (row, a, b) in enumerate(rows):
        for i, v in row.items():
            A[r, i] = v
        lo[r], hi[r] = a, b
    objective = -resident if resident_at_least is None else disk
    with _no_stdout():
        result = milp(
            objective,
            constraints=LinearConstraint(A, lo, hi),
            integrality=integrality,
            bounds=Bounds(lower, upper),
            options={"mip_rel_gap": GAP, "time_limit": TIME_LIMIT, "presolve": presolve},
        )
    if result.x is None:
        if result.status == 1:  # the time limit, before any placement was found
            raise RuntimeError("the reference MILP ran out of time without a placement")
        return None
    x = np.round(result.x).astype(int)
    targets = [0] * len(p.sizes)
    for c in range(C):
        queue = list(members[c])
        for t in places:
            if ("n", c, t) in var:
                for _ in range(x[var[("n", c, t)]]):
                    targets[queue.pop()] = t
    main = next((d for d in range(k) if x[var[("y", d)]]), None)
    bound = None
    if resident_at_least is None and result.mip_dual_bound is not None:  # no placement holds more
        bound = int(-result.mip_dual_bound * scale) + 1
    out = Optimum(
        bound=bound,
        resident=sum(p.sizes[u] for u, t in enumerate(targets) if t < k),
        disk=sum(p.sizes[u] for u, t in enumerate(targets) if t == k + 1),
        targets=targets,
        main=main,
    )
    return out


def optimum(p: packing.Problem) -> Optimum | None:
    """The most accelerator-resident bytes any valid placement reaches (then the least on disk),
    or ``None`` when no valid placement exists.

    The solver accepts a budget exceeded by up to a millionth (HiGHS's default tolerance;
    tighter ones made it prune valid placements), so its feasible set contains every valid
    placement, and ``upper`` (its bound) is never too low, up to its objective tolerance of
    about a millionth (a 256-byte unit of a 9 GB plan can slip through). HiGHS's presolve has
    also been seen to call a feasible model infeasible, and a solve whose best placement
    overshoots a budget by a few bytes bounds that overshooting model, not this one: so every
    model is solved with and without presolve, and the tighter bound is kept. Ratios are taken
    against ``upper``; a plan above it would fail the tests (it never has).

    ``resident``/``targets``/``disk`` describe a placement that passes the exact re-check
    (:func:`holds`). When the solver's best placements overshoot a budget by a few bytes, one
    is solved again with every budget two millionths smaller; if that holds less than
    ``upper``, the truth lies between, and an exhaustive enumeration settles it when the model
    has few enough units. Otherwise ``open`` is set (``targets`` is ``None`` when no valid
    placement was found at all).
    """
    found = [f for f in (_solve(p, None), _solve(p, None, presolve=False)) if f is not None]
    if not found:
        return None
    # each solve's bound holds for its model within tolerance; the tighter one is kept (never
    # below a placement that passes the exact check): a wrong one would show as a plan above it
    upper = min(max(f.resident, f.bound or 0) for f in found)
    valid = [f for f in found if holds(p, f.targets, f.main)]
    if valid:
        best = max(valid, key=lambda f: f.resident)
        upper = max(upper, best.resident)
    else:  # only placements that overshoot a budget by a few bytes
        tight = _solve(p, None, margin=2e-6) or _solve(p, None, margin=2e-6, presolve=False)
        witness = tight if tight is not None and holds(p, tight.targets, tight.main) else None
        if witness is not None and witness.resident >= upper * (1 - GAP) - 1:
            best = witness
        elif (p.k + 2) ** len(p.sizes) <= EXHAUSTIVE:  # small enough to settle exactly
            exact = exhaustive(p)
            if exact is None:
                return None
            resident, targets, main = exact
            disk = sum(p.sizes[u] for u, t in enumerate(targets) if t == p.k + 1)
            return Optimum(resident, resident, disk, list(targets), main, upper=resident)
        else:  # the truth lies between the witness (if any) and the bound
            best = witness or found[0]
            best.open = True
            if witness is None:
                best.targets = None
            best.upper = upper
            return best
    lean = _solve(p, best.resident)
    if lean is not None and holds(p, lean.targets, lean.main) and lean.resident >= best.resident:
        best = lean
    best.upper = upper
    return best


def problem_of(model, budgets, **kw) -> packing.Problem:
    """The planner's :class:`~accelreg.planner.packing.Problem` for ``model`` and ``budgets``."""
    from accelreg.planner.budgets import parse_budgets
    from accelreg.planner.plan import analyze

    parsed = parse_budgets(budgets)
    layout = analyze(model, backend=parsed.backend, **kw)[0]
    return packing.Problem(
        sizes=layout.unit_size,
        layers=layout.unit_layer,
        blocks=layout.unit_block,
        cpu_ok=layout.unit_cpu_ok,
        disk_ok=layout.unit_disk_ok,
        caps=[c for _, c in parsed.accelerators],
        cpu=parsed.cpu,
        disk=parsed.disk,
    )


# -- the reference against exhaustive enumeration ------------------------------------------
def exhaustive(p: packing.Problem) -> tuple[int, tuple[int, ...], int | None] | None:
    """``(resident bytes, targets, main)`` of the best of every assignment and every main device."""
    k = p.k
    best = None
    for targets in itertools.product(range(k + 2), repeat=len(p.sizes)):
        resident = sum(p.sizes[u] for u, t in enumerate(targets) if t < k)
        if best is not None and resident <= best[0]:
            continue
        for main in [*range(k), None]:
            if holds(p, targets, main):
                best = (resident, targets, main)
                break
    return best


def test_the_reference_agrees_with_exhaustive_enumeration():
    pytest.importorskip("scipy", reason="the exact reference is a scipy MILP (in the test extra)")
    import random

    rng = random.Random(12)
    for _ in range(60):
        n = rng.randint(1, 6)
        sizes = [rng.randint(1, 9) for _ in range(n)]
        layers = [rng.randint(1, s) for s in sizes]
        k = rng.randint(0, 3)
        p = packing.Problem(
            sizes=sizes,
            layers=layers,
            blocks=[False] * n,
            cpu_ok=[rng.random() < 0.8 for _ in range(n)],
            disk_ok=[rng.random() < 0.8 for _ in range(n)],
            caps=[rng.randint(0, 14) for _ in range(k)],
            cpu=rng.choice([None, rng.randint(0, 20)]),
            disk=rng.choice([None, None, rng.randint(0, 20)]),
        )
        found, exact = optimum(p), exhaustive(p)
        assert (None if found is None else found.resident) == (None if exact is None else exact[0]), p
        assert found is None or found.upper - found.resident <= 1
