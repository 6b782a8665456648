"""Place indivisible units on devices: contiguous runs in forward order, offload only what must go.

This module knows nothing about torch or models: a :class:`Problem` is a sequence of unit sizes
in forward order, the budgets, and per-unit facts (largest layer, whether it is a no-split
block, where it may be offloaded). :func:`solve` returns a target per unit: accelerator index
``0..k-1``, :data:`CPU` (``k``) or :data:`DISK` (``k + 1``).

The rules (see docs/planner.md):

* Accelerators are filled in order; forward order is contiguous: the accelerator index never
  decreases along the sequence. A unit that fits on no remaining accelerator goes to the cpu
  (then disk) while the units after it stay on accelerators.
* Offload headroom: when anything is on cpu or disk, the *main* device (accelerate runs
  offloaded layers there; :attr:`Solution.main`, by default the first accelerator holding
  anything in forward order) keeps room for the largest offloaded layer, and the cpu keeps room
  for the largest disk layer. For the contiguous fill, found by a fixpoint: plan, measure the
  offloaded layers, reserve, plan again.
* ``sequential`` fills each device as far as it goes; ``balanced`` minimises the largest device
  load (binary search on a load cap, each probe ``O(k log n)`` with prefix sums), then places
  each cut near ``remaining / devices left``; ``balanced_low_0`` puts as little as possible on
  the first device. Cuts next to a no-split block are preferred (a cut between two plain leaves,
  e.g. ``wte`` | ``wpe``, can separate tensors a parent's ``forward`` adds together).
* If the contiguous plan offloads but the units fit on the accelerators when packed out of
  order, the packed plan wins (an extra device boundary costs less than streaming weights).
* Once something must be offloaded, :func:`.residency.search` looks for the placement with the
  most bytes on accelerators (then the fewest on disk), choosing the headroom and the main
  device; it replaces the contiguous plan only when strictly better, and :func:`arrange` lays
  its units out contiguously when that fits. If nothing is found, first-fit packings are tried
  before :class:`NoFit` is raised (with ``gave_up`` set when the search stopped at its limit).
* :attr:`Problem.any_main`: every accelerator that holds something keeps the headroom, so the
  placement is valid whichever of them runs the offloaded layers (stock accelerate 1.15+
  picks a hash-ordered one); the search then finds the most resident placement under that rule
  (using fewer accelerators is one way to pay less for it).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import residency

__all__ = ["NoFit", "Problem", "Solution", "solve", "validate"]

STRATEGIES = ("balanced", "balanced_low_0", "sequential")
_MAX_ROUNDS = 100


@dataclass
class Problem:
    """Units in forward order and the budgets to place them in."""

    sizes: Sequence[int]
    layers: Sequence[int]
    blocks: Sequence[bool]
    cpu_ok: Sequence[bool]
    disk_ok: Sequence[bool]
    caps: Sequence[int]
    cpu: int | None
    disk: int | None
    strategy: str = "balanced"
    #: Every accelerator holding a unit keeps the offload headroom (not only the main device).
    any_main: bool = False

    @property
    def k(self) -> int:
        return len(self.caps)

    def reserved(self, caps: Sequence[int], reserve: int, main: int | None) -> list[int]:
        """``caps`` less the offload headroom ``reserve``: on ``main`` only, or (with
        :attr:`any_main`) on every accelerator, one too small for it getting ``0``."""
        out = list(caps)
        if not reserve:
            return out
        if self.any_main:
            return [c - reserve if c > reserve else 0 for c in out]
        if main is not None:
            out[main] -= reserve
        return out


@dataclass
class Solution:
    """A target per unit, and how it was found.

    ``main`` is the main device (``None``: nothing offloaded, or nothing on an accelerator);
    ``optimal`` is True when no placement keeps more bytes on the accelerators (then fewer on
    disk), False when a search stopped at its node limit, None when nothing was offloaded."""

    targets: list[int]
    method: str
    main: int | None = None
    reserve: int = 0
    reserve_cpu: int = 0
    notes: list[str] = field(default_factory=list)
    optimal: bool | None = None


class NoFit(Exception):
    """No placement satisfies the budgets; ``reasons`` says why, one line each. ``gave_up`` is
    the node limit when a search stopped there (then "no fit" is not proven)."""

    def __init__(self, reasons: list[str], failed: list[int], gave_up: int | None = None) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons
        self.failed = failed
        self.gave_up = gave_up
        #: ``(unit, device, shortfall)`` for units that must stay on an accelerator but found no room
        self.needs: list[tuple[int, int, int]] = []
        self.on: list[int] = []
        self.device: list[int] = []


# -- validity -----------------------------------------------------------------------------
def validate(p: Problem, targets: Sequence[int], main: int | None = None) -> list[str]:
    """Every broken budget or placement rule of ``targets``, one line each. ``main`` is the main
    device (it must hold something); by default the first accelerator used in forward order.
    With :attr:`Problem.any_main` every accelerator holding a unit keeps the headroom."""
    k = p.k
    cpu_t, disk_t = k, k + 1
    loads = [0] * (k + 2)
    off_layer = disk_layer = 0
    problems: list[str] = []
    if main is not None and main not in targets:
        problems.append(f"main device {main} holds nothing")
    for u, t in enumerate(targets):
        s = p.sizes[u]
        loads[t] += s
        if t < k:
            if main is None:
                main = t
        else:
            off_layer = max(off_layer, p.layers[u])
            if t == disk_t:
                disk_layer = max(disk_layer, p.layers[u])
                if not p.disk_ok[u]:
                    problems.append(f"unit {u} may not live on disk")
                if p.disk is None:
                    problems.append(f"unit {u} on disk, which has no budget")
            elif not p.cpu_ok[u]:
                problems.append(f"unit {u} may not live on cpu")
            elif p.cpu is None:
                problems.append(f"unit {u} on cpu, which has no budget")
    used = set(targets) if p.any_main else {main}
    for d in range(k):
        need = loads[d] + (off_layer if d in used else 0)
        if need > p.caps[d]:
            problems.append(f"accelerator {d}: {need} > {p.caps[d]}")
    if p.cpu is not None and loads[cpu_t] + disk_layer > p.cpu:
        problems.append(f"cpu: {loads[cpu_t] + disk_layer} > {p.cpu}")
    if p.disk is not None and loads[disk_t] > p.disk:
        problems.append(f"disk: {loads[disk_t]} > {p.disk}")
    return problems


def _measure(p: Problem, targets: Sequence[int]) -> tuple[int | None, int, int]:
    """``(main, largest offloaded layer, largest disk layer)`` of a placement."""
    k = p.k
    main = None
    off = disk = 0
    for u, t in enumerate(targets):
        if t < k:
            if main is None:
                main = t
        else:
            layer = p.layers[u]
            if layer > off:
                off = layer
            if t == k + 1 and layer > disk:
                disk = layer
    return main, off, disk


# -- contiguous segments over the on-accelerator sequence ---------------------------------
class _Runs:
    """Contiguous segmentations of a size sequence over devices with caps (prefix sums)."""

    def __init__(self, sizes: Sequence[int], blocks: Sequence[bool], caps: Sequence[int]) -> None:
        n = len(sizes)
        prefix = [0] * (n + 1)
        acc = 0
        for i, s in enumerate(sizes):
            acc += s
            prefix[i + 1] = acc
        self.n, self.P, self.caps, self.k = n, prefix, list(caps), len(caps)
        any_block = any(blocks)
        pref = [True] * (n + 1)
        if any_block:
            for i in range(1, n):
                pref[i] = blocks[i - 1] or blocks[i]
        last = [0] * (n + 1)
        nxt = [n] * (n + 1)
        cur = 0
        for i in range(n + 1):
            if pref[i]:
                cur = i
            last[i] = cur
        cur = n
        for i in range(n, -1, -1):
            if pref[i]:
                cur = i
            nxt[i] = cur
        self.pref, self.last, self.next = pref, last, nxt
        #: Cut only at preferred positions (next to a no-split block) when that still fits.
        self.strict = any_block and self.feasible_strict()

    def feasible_strict(self) -> bool:
        self.strict = True
        ok = self.feasible(0, 0)
        self.strict = False
        return ok

    def end(self, start: int, cap: float) -> int:
        """The furthest end such that ``sizes[start:end]`` fits in ``cap`` (a preferred cut in
        strict mode, or ``start`` when none is reachable)."""
        e = bisect_right(self.P, self.P[start] + cap, start, self.n + 1) - 1
        if self.strict:
            pe = self.last[e]
            return pe if pe > start else start
        return e

    def feasible(self, start: int, d: int, cap: float | None = None) -> bool:
        """Whether ``sizes[start:]`` fits on devices ``d..k-1`` (each also capped at ``cap``)."""
        n, caps = self.n, self.caps
        for j in range(d, self.k):
            if start >= n:
                return True
            c = caps[j] if cap is None else min(caps[j], cap)
            start = self.end(start, c)
        return start >= n

    def feasible_budgeted(self, start: int, d: int) -> bool:
        """:meth:`feasible` over the devices ``d..k-1`` that have a budget: what
        :meth:`balanced` spreads over (a device without one takes not even weightless units)."""
        n = self.n
        for j in range(d, self.k):
            if start >= n:
                return True
            if self.caps[j] > 0:
                start = self.end(start, self.caps[j])
        return start >= n

    def load(self, a: int, b: int) -> int:
        return self.P[b] - self.P[a]

    def sequential(self) -> list[int]:
        """Fill each device as far as it goes, backing off to a preferred cut when that still fits."""
        cuts = []
        start = 0
        for d in range(self.k):
            e = self.end(start, self.caps[d])
            if not self.strict and e < self.n and not self.pref[e]:
                pe = self.last[e]
                if pe > start and self.feasible(pe, d + 1):
                    e = pe
            cuts.append(e)
            start = e
        return cuts

    def _min_cap(self, start: int, d: int, devices: int) -> int:
        """The smallest per-device load cap under which ``sizes[start:]`` fits on ``d..k-1``."""
        hi = max(self.caps[d:], default=0)
        if start >= self.n or not self.feasible(start, d, hi):
            return hi
        P = self.P
        biggest = max(P[i + 1] - P[i] for i in range(start, self.n))
        lo = max(biggest, -(-(P[self.n] - P[start]) // max(devices, 1)))
        if lo >= hi:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if self.feasible(start, d, mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def balanced(self, start: int = 0, d_from: int = 0) -> list[int]:
        """Cuts (one end index per device) minimising the largest load, then evening the rest."""
        cuts = [start] * d_from
        devices = [d for d in range(d_from, self.k) if self.caps[d] > 0]
        cap = self._min_cap(start, d_from, len(devices))
        n = self.n
        for d in range(d_from, self.k):
            if self.caps[d] <= 0 or start >= n:
                cuts.append(start)
                continue
            left = sum(1 for j in devices if j >= d)
            limit = min(self.caps[d], cap)
            e_max = self.end(start, limit)
            if left <= 1:
                e = e_max
            else:
                target = (self.P[n] - self.P[start]) / left
                e = self._choose(start, d, target, e_max, cap)
            cuts.append(e)
            start = e
        return cuts

    def _choose(self, start: int, d: int, target: float, e_max: int, cap: int) -> int:
        lo = min(self.end(start, target), e_max)
        options = {lo, min(lo + 1, e_max), self.last[lo], self.next[lo], self.next[min(lo + 1, e_max)]}
        good = [
            e
            for e in options
            if start < e <= e_max and (self.pref[e] or not self.strict) and self.feasible(e, d + 1, cap)
        ]
        if good:
            return min(good, key=lambda e: (not self.pref[e], abs(self.load(start, e) - target), e))
        if self.strict:  # the furthest preferred fill is feasible (greedy is optimal)
            return e_max
        # The furthest fill is always feasible; find the first feasible end before it.
        a, b = start + 1, e_max
        while a < b:
            mid = (a + b) // 2
            if self.feasible(mid, d + 1, cap):
                b = mid
            else:
                a = mid + 1
        return b

    def low_zero(self) -> list[int]:
        """As little as possible on the first device with a budget, the rest balanced."""
        first = next((d for d in range(self.k) if self.caps[d] > 0), None)
        if first is None:
            return [0] * self.k
        if self.feasible_budgeted(0, first + 1):
            p = 0
        else:
            e_max = self.end(0, self.caps[first])
            a, b = 0, e_max
            while a < b:
                mid = (a + b) // 2
                if self.feasible_budgeted(mid, first + 1):
                    b = mid
                else:
                    a = mid + 1
            p = a
            if not self.pref[p]:
                q = self.next[p]
                if q <= e_max and self.feasible_budgeted(q, first + 1):
                    p = q
                elif self.strict:
                    p = e_max
        cuts = [0] * first + [p]
        rest = self.balanced(p, first + 1)
        return cuts + rest[first + 1 :]


# -- the solver ---------------------------------------------------------------------------
def solve(p: Problem, nodes: int | None = None) -> Solution:
    """Place every unit of ``p`` (see the module docstring); raises :class:`NoFit`. ``nodes``
    limits the search for the most resident placement (default :data:`~.residency.SEARCH_NODES`)."""
    nodes = residency.SEARCH_NODES if nodes is None else nodes
    if p.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {p.strategy!r}")
    n, k = len(p.sizes), p.k
    if n == 0:
        return Solution([], "empty")
    forced = [False] * n  # offloaded to make room for a unit that must stay on an accelerator
    keep = [not (p.cpu_ok[u] or p.disk_ok[u]) for u in range(n)]  # may not (or could not) be offloaded
    reserve = reserve_cpu = 0
    excluded: set[int] = set()
    failure: NoFit | None = None
    contiguous: Solution | None = None
    # The strategy's redistribution over the devices changes neither which units are offloaded
    # nor (but for balanced_low_0) the first device: it is done once, for the plan returned.
    segment = p.strategy == "balanced_low_0"
    final: tuple[list[int], int] | None = None
    for _ in range(_MAX_ROUNDS):
        caps = [0 if d in excluded else c for d, c in enumerate(p.caps)]
        main = next((d for d in range(k) if caps[d] > 0), None)
        if main is not None and reserve and not p.any_main and caps[main] <= reserve:
            excluded.add(main)
            continue
        caps = p.reserved(caps, reserve, main)
        try:
            targets = _contiguous(p, caps, reserve_cpu, forced, keep, segment)
        except NoFit as exc:
            failure = exc
            if exc.needs:  # kept units found no room: offload what precedes them instead
                if _make_room(p, exc, forced, keep):
                    continue
            elif any(not keep[u] for u in exc.failed):  # no room offloaded: keep them on accelerators
                for u in exc.failed:
                    keep[u] = True
                    forced[u] = False
                continue
            break
        used_main, off, disk = _measure(p, targets)
        if reserve and used_main is not None and used_main != main and not p.any_main:
            excluded.update(d for d in range(k) if d < used_main)
            continue
        if (used_main is None or off <= reserve) and disk <= reserve_cpu:
            if validate(p, targets):  # the reserves themselves do not fit (e.g. cpu too small to stage disk)
                failure = NoFit(["offload headroom does not fit"], [])
                break
            contiguous = Solution(
                targets, "contiguous", used_main, reserve if used_main is not None else 0, reserve_cpu
            )
            final = (caps, reserve_cpu)
            break
        reserve, reserve_cpu = max(reserve, off), max(reserve_cpu, disk)
    if contiguous is not None and not segment and final is not None:

        def finish(sol: Solution) -> Solution:
            targets = _contiguous(p, final[0], final[1], forced, keep)
            if not validate(p, targets):  # the main device is the first used in forward order
                sol.targets, sol.main = targets, _measure(p, targets)[0]
            return sol

    else:

        def finish(sol: Solution) -> Solution:
            return sol

    if contiguous is not None and not any(t >= k for t in contiguous.targets):
        return finish(contiguous)
    if contiguous is not None and sum(p.sizes) <= sum(p.caps):
        packed = _pack_on_accelerators(p)
        if packed is not None:
            packed.notes.append("packed out of forward order: the contiguous plan would have offloaded")
            return packed
    # Something must be offloaded (or no contiguous plan exists): keep the most on accelerators.
    at_least = None if contiguous is None else _resident(p, contiguous.targets)
    found = residency.search(
        p.sizes,
        p.layers,
        p.cpu_ok,
        p.disk_ok,
        p.caps,
        p.cpu,
        p.disk,
        at_least=at_least,
        nodes=nodes,
        any_main=p.any_main,
    )
    if found.counts is not None:
        sol = arrange(p, found)
        if contiguous is not None:
            sol.notes.append(
                "kept more on the accelerators than the contiguous plan"
                + ("" if sol.method == "contiguous" else ", packing out of forward order")
            )
        elif sol.method != "contiguous":
            sol.notes.append("packed out of forward order: no contiguous plan fits")
        return sol
    if contiguous is not None:
        contiguous.optimal = not found.cut
        return finish(contiguous)
    for packer in (_first_fit_forward, _first_fit_decreasing):
        sol = _with_headroom(p, packer)
        if sol is not None:
            sol.notes.append("packed out of forward order: no contiguous plan fits")
            sol.optimal = False
            return sol
    if found.cut:
        raise NoFit(
            ["no plan found within the search limit"], failure.failed if failure else [], gave_up=nodes
        )
    raise failure or NoFit(["no placement satisfies every budget"], [])


def _resident(p: Problem, targets: Sequence[int]) -> tuple[int, int]:
    """``(bytes on accelerators, bytes on disk)``."""
    k = p.k
    on = sum(p.sizes[u] for u, t in enumerate(targets) if t < k)
    disk = sum(p.sizes[u] for u, t in enumerate(targets) if t == k + 1)
    return on, disk


def arrange(p: Problem, found: residency.Found) -> Solution:
    """Units for the search's counts: the last units of each class are the offloaded ones; the
    resident ones run contiguously over the devices (with the strategy) when that fits, the main
    device keeping the headroom; otherwise each device takes its counts in forward order."""
    assert found.counts is not None and found.members is not None
    k, n = p.k, len(p.sizes)
    targets = [0] * n
    resident: list[int] = []
    by_class: list[list[int]] = []
    for row, members in zip(found.counts, found.members, strict=True):
        on = sum(row[:k])
        by_class.append(members[:on])
        resident.extend(members[:on])
        rest = members[on:]
        for u in rest[: row[k]]:
            targets[u] = k
        for u in rest[row[k] :]:
            targets[u] = k + 1
    resident.sort()
    H = found.headroom
    optimal = not found.cut
    if resident:
        candidates: list[int | None] = list(range(k)) if H and not p.any_main else [None]
        for main in candidates:
            if main is not None and p.caps[main] <= H:
                continue
            caps = p.reserved(p.caps, H, main)
            placed = _segment(p, resident, caps, targets)
            if placed == len(resident) and not validate(p, targets, main):
                if main is None and H:
                    main = _measure(p, targets)[0]
                return Solution(targets, "contiguous", main, H, found.staging, optimal=optimal)
    for members, row in zip(by_class, found.counts, strict=True):
        i = 0
        for d in range(k):
            for u in members[i : i + row[d]]:
                targets[u] = d
            i += row[d]
    main = found.main
    if validate(p, targets, main):  # pragma: no cover - the search only returns valid counts
        raise AssertionError(f"search produced an invalid placement: {validate(p, targets, main)}")
    return Solution(targets, "packed", main, H, found.staging, optimal=optimal)


def _contiguous(
    p: Problem, caps: list[int], reserve_cpu: int, forced: list[bool], keep: list[bool], segment: bool = True
) -> list[int]:
    """One contiguous placement for fixed caps; raises :class:`NoFit` with what went wrong.
    Without ``segment`` the accelerators keep the greedy fill (same units on and off them,
    same first device) instead of the strategy's redistribution."""
    n, k = len(p.sizes), p.k
    sizes = p.sizes
    suffix = [0] * (k + 1)
    for d in range(k - 1, -1, -1):
        suffix[d] = max(caps[d], suffix[d + 1])
    on: list[int] = []
    device: list[int] = []  # the greedy's device of each unit in ``on``
    off: list[int] = []
    needs: list[tuple[int, int, int]] = []
    j = next((d for d in range(k) if caps[d] > 0), k)
    used = 0
    biggest = max(caps, default=0)
    tail = False  # the accelerators are exhausted: everything from here on is offloaded
    for u in range(n):
        if forced[u]:
            off.append(u)
            continue
        s = sizes[u]
        if not tail and j < k and used + s <= caps[j]:
            used += s
            on.append(u)
            device.append(j)
        elif not tail and j + 1 < k and suffix[j + 1] >= s:
            jj = j + 1
            while caps[jj] < s:
                jj += 1
            j, used = jj, s
            on.append(u)
            device.append(j)
        elif keep[u]:
            last = min(j, k - 1)
            needs.append((u, last, (used + s - caps[last]) if k else s))
        else:
            off.append(u)
            tail = tail or s <= biggest  # it would fit an accelerator, but none is left
    if needs:
        exc = NoFit(
            [f"{len(needs)} unit(s) that must stay on an accelerator found no room"], [u for u, _, _ in needs]
        )
        exc.needs, exc.on, exc.device = needs, on, device
        raise exc
    targets = [0] * n
    if on and not segment:
        for u, d in zip(on, device, strict=True):
            targets[u] = d
    elif on and _segment(p, on, caps, targets) < len(on):  # cannot happen: the greedy proved it fits
        raise AssertionError("contiguous segmentation lost units")
    cpu_left = None if p.cpu is None else p.cpu - reserve_cpu
    disk_left = p.disk
    failed = []
    for u in off:
        s = sizes[u]
        if p.cpu_ok[u] and cpu_left is not None and s <= cpu_left:
            targets[u] = k
            cpu_left -= s
        elif p.disk_ok[u] and disk_left is not None and s <= disk_left:
            targets[u] = k + 1
            disk_left -= s
        else:
            failed.append(u)
    if failed:
        raise NoFit([f"{len(failed)} unit(s) fit nowhere"], failed)
    return targets


def _segment(p: Problem, units: list[int], caps: list[int], targets: list[int]) -> int:
    """Cut ``units`` (forward order) into runs over the devices with the strategy, writing each
    one's device into ``targets``; returns how many were placed (all of them, when they fit)."""
    runs = _Runs([p.sizes[u] for u in units], [p.blocks[u] for u in units], caps)
    if not runs.feasible(0, 0):
        return 0
    if p.strategy == "sequential":
        cuts = runs.sequential()
    elif p.strategy == "balanced_low_0":
        cuts = runs.low_zero()
    else:
        cuts = runs.balanced()
    start = 0
    for d, e in enumerate(cuts):
        for i in range(start, e):
            targets[units[i]] = d
        start = max(start, e)
    return start


def _make_room(p: Problem, exc: NoFit, forced: list[bool], keep: list[bool]) -> bool:
    """Offload the units just before each kept unit that found no room (nearest first, on its
    device and then earlier ones) until the shortfall is covered."""
    room = max(p.cpu or 0, p.disk or 0)
    position = {u: i for i, u in enumerate(exc.on)}
    freed_any = False
    for u, _, deficit in exc.needs:
        # the kept unit's place in the greedy sequence: just after the last placed unit before it
        i = max((position[v] for v in exc.on if v < u), default=-1) if exc.on else -1
        picked: list[int] = []
        freed = 0
        while i >= 0 and freed < deficit:
            v = exc.on[i]
            if not keep[v] and not forced[v] and 0 < p.sizes[v] <= room and (p.cpu_ok[v] or p.disk_ok[v]):
                picked.append(v)
                freed += p.sizes[v]
            i -= 1
        # drop picks that were not needed (small ones first): keep the offloaded set tight
        for v in sorted(picked, key=lambda v: p.sizes[v]):
            if freed - p.sizes[v] >= deficit:
                picked.remove(v)
                freed -= p.sizes[v]
        for v in picked:
            forced[v] = True
            freed_any = True
    return freed_any


def _pack_on_accelerators(p: Problem) -> Solution | None:
    for packer in (_first_fit_forward, _first_fit_decreasing):
        targets = packer(p, list(p.caps), None, None, accelerators_only=True)
        if targets is not None:
            main, _, _ = _measure(p, targets)
            return Solution(targets, packer.__name__.strip("_"), main)
    return None


def _first_fit_forward(p, caps, cpu, disk, *, accelerators_only=False, order=None):
    k = p.k
    free = [*caps, cpu if cpu is not None else -1, disk if disk is not None else -1]
    targets = [0] * len(p.sizes)
    for u in order if order is not None else range(len(p.sizes)):
        s = p.sizes[u]
        for t in range(k + (0 if accelerators_only else 2)):
            if t == k and not p.cpu_ok[u]:
                continue
            if t == k + 1 and not p.disk_ok[u]:
                continue
            if free[t] >= s:
                free[t] -= s
                targets[u] = t
                break
        else:
            return None
    return targets


def _first_fit_decreasing(p, caps, cpu, disk, *, accelerators_only=False):
    order = sorted(range(len(p.sizes)), key=lambda u: -p.sizes[u])
    return _first_fit_forward(p, caps, cpu, disk, accelerators_only=accelerators_only, order=order)


def _with_headroom(p: Problem, packer) -> Solution | None:
    """Run ``packer`` with the offload headroom reserved on each candidate main device in turn
    (or on none, for a cpu/disk-only plan), growing the reserves until the placement is valid."""
    k = p.k
    mains = [*(d for d in range(k) if p.caps[d] > 0)]
    for main in [*(mains[:1] if p.any_main else mains), None]:
        reserve = reserve_cpu = 0
        for _ in range(_MAX_ROUNDS):
            if main is None:
                caps = [0] * k
            elif not p.any_main and reserve and p.caps[main] <= reserve:
                break
            else:
                caps = p.reserved(p.caps, reserve, main)
            cpu = None if p.cpu is None else p.cpu - reserve_cpu
            if cpu is not None and cpu < 0:
                break
            targets = packer(p, caps, cpu, p.disk)
            if targets is None:
                break
            used_main, off, disk = _measure(p, targets)
            if not validate(p, targets):
                return Solution(targets, packer.__name__.strip("_"), used_main, off, disk)
            if off <= reserve and disk <= reserve_cpu:
                break  # the reserves are in place but the main device differs: try another
            reserve, reserve_cpu = max(reserve, off), max(reserve_cpu, disk)
    return None
