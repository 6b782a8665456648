"""The most bytes the accelerators can hold once something must be offloaded.

accelerate streams every cpu- or disk-offloaded layer to the *main* device on every forward
pass, so when a model does not fit, bytes left off an accelerator that could have stayed cost
on every step. :func:`search` finds the placement with the most accelerator-resident bytes,
then the fewest disk bytes, under the rules of :func:`accelreg.planner.packing.validate`, with
the main device *chosen* (any accelerator that holds something; the map lists it first).

Two choices couple the places, and the search enumerates them:

* ``H``, the headroom: the largest layer allowed off the accelerators (``0``: nothing offloaded).
  Units with a larger layer must stay on an accelerator; the main device keeps ``H`` free.
* the main device (devices with equal budgets are interchangeable; one of them is tried).
  With ``any_main`` there is no such choice: every accelerator that holds something keeps ``H``
  (one too small for it holds nothing), so any of them can run the offloaded layers.

Each choice leaves a multiple-knapsack problem over *classes* of interchangeable units (same
size, largest layer and offload rights; a 126-block model has a handful). Depth-first branch and
bound distributes each class over the places, largest class first, tightest accelerator first,
most on the cpu before the disk, so its first leaf is a best-fit-decreasing packing; a bound
(bytes placed + what the rooms and the remaining units can still add; disk bytes that fit nowhere
else) prunes the rest, and devices with equal room are not told apart. The cpu's staging room
for the largest disk layer is kept as the search goes (it only grows). Every choice first gets
its best-fit-decreasing leaf, then rounds of growing node allowances, best bound first; a choice
whose bound cannot beat the best placement found is skipped. Everything is exact unless the node
limit is reached: then the best placement found is returned and :attr:`Found.cut` says the search
gave up (a "does not fit" after that is not a proof).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SEARCH_NODES", "Found", "search"]

#: Default node limit of :func:`search` (``plan(..., search_limit=...)`` overrides it).
SEARCH_NODES = 20_000
#: Search depth (classes x places) above which only the first leaf (best-fit decreasing) is built.
_DEPTH = 600


@dataclass
class Found:
    """The best placement found: ``counts[c][t]`` units of class ``c`` on place ``t``
    (accelerators ``0..k-1``, cpu ``k``, disk ``k + 1``)."""

    counts: list[list[int]] | None = None
    members: list[list[int]] | None = None
    resident: int = -1
    disk: int = 0
    main: int | None = None
    headroom: int = 0
    staging: int = 0
    nodes: int = 0
    #: The node limit stopped a search: the result may not be the best (or a fit may exist).
    cut: bool = False

    @property
    def proven(self) -> bool:
        """No placement keeps more on the accelerators (and, at that, less on disk)."""
        return not self.cut


class _Stop(Exception):
    pass


class _Search:
    """The classes of one problem, its choices, and the search under each choice."""

    def __init__(self, sizes, layers, cpu_ok, disk_ok, caps, cpu, disk, any_main=False) -> None:
        groups: dict[tuple[int, int, bool, bool], list[int]] = {}
        for u in range(len(sizes)):
            groups.setdefault((sizes[u], layers[u], bool(cpu_ok[u]), bool(disk_ok[u])), []).append(u)
        keys = sorted(groups, key=lambda g: (-g[0], -g[1], not g[2], not g[3]))
        self.size = [g[0] for g in keys]
        self.layer = [g[1] for g in keys]
        self.cpu_ok = [g[2] for g in keys]
        self.disk_ok = [g[3] for g in keys]
        self.members = [groups[g] for g in keys]
        self.count = [len(m) for m in self.members]
        self.caps = list(caps)
        self.cpu, self.disk = cpu, disk
        self.k = len(self.caps)
        self.any_main = any_main
        self.C = len(keys)
        self.vol = [s * m for s, m in zip(self.size, self.count, strict=True)]
        self.total = sum(self.vol)

    # -- the choices ------------------------------------------------------------------------
    def choices(self) -> list[tuple[int, int, int | None]]:
        """``(bound, H, main)`` for every choice that may hold a valid placement, best bound
        first. ``H = -1``: nothing on any accelerator (no main device, no headroom)."""
        k, caps = self.k, self.caps
        off_layers = sorted({self.layer[c] for c in range(self.C) if any(self.where(c, self.layer[c]))})
        smallest = min(self.size, default=0)
        distinct: dict[int, int] = {}
        for d in range(k):
            distinct.setdefault(caps[d], d)
        out = []
        for H in [0, *(h for h in off_layers if h > 0)]:
            mains: list[int | None] = (
                [None] if H == 0 or self.any_main else [d for c, d in distinct.items() if c - H >= smallest]
            )
            for main in mains:
                bound = self._bound(H, main)
                if bound is not None:
                    out.append((bound, H, main))
        if all(any(self.where(c, -1)) for c in range(self.C)):
            out.append((0, -1, None))
        out.sort(key=lambda c: (-c[0], c[1], -1 if c[2] is None else c[2]))
        return out

    def rooms(self, H: int, main: int | None) -> list[int]:
        """Room on each place: accelerators (the main device less ``H``; with ``any_main`` each
        one less ``H``, negative when it cannot keep ``H``), cpu, disk (-1: none)."""
        rooms = list(self.caps) if H >= 0 else [0] * self.k
        if self.any_main and H > 0:
            rooms = [r - H for r in rooms]
        elif main is not None:
            rooms[main] -= H
        return [*rooms, -1 if self.cpu is None else self.cpu, -1 if self.disk is None else self.disk]

    def where(self, c: int, H: int) -> tuple[bool, bool]:
        """Whether class ``c`` may go to the cpu, to the disk, when layers up to ``H`` may be
        offloaded (``H = -1``: any). A disk layer is staged through the cpu: it must fit there."""
        layer = self.layer[c]
        if 0 <= H < layer:
            return False, False
        on_cpu = self.cpu_ok[c] and self.cpu is not None
        on_disk = self.disk_ok[c] and self.disk is not None and (self.cpu is None or layer <= self.cpu)
        return on_cpu, on_disk

    def _bound(self, H: int, main: int | None) -> int | None:
        """Most bytes the accelerators can hold under this choice, or None when it cannot work."""
        k = self.k
        rooms = self.rooms(H, main)
        acc = rooms[:k]
        if self.any_main:  # a device that cannot keep the headroom holds nothing
            acc = [max(r, 0) for r in acc]
        elif any(r < 0 for r in acc):
            return None
        biggest = max(acc, default=0)
        cpu_room, disk_room = max(rooms[k], 0), max(rooms[k + 1], 0)
        forced = fits = to_disk = 0
        for c in range(self.C):
            size, vol = self.size[c], self.vol[c]
            on_cpu, on_disk = self.where(c, H)
            on_cpu = on_cpu and cpu_room >= size
            on_disk = on_disk and disk_room >= size
            if size <= biggest:
                fits += vol
            if not on_cpu and not on_disk:
                if size > biggest:
                    return None
                forced += vol
            elif on_disk:
                to_disk += vol
        room = sum(acc)
        # what the accelerators cannot hold goes to the cpu, except what the disk may take
        if forced > room or self.total - room > cpu_room + min(disk_room, to_disk):
            return None
        return min(room, fits)

    # -- one choice -------------------------------------------------------------------------
    def solve(self, H: int, main: int | None, best: Found, limit: int, greedy: bool = False) -> None:
        """Improve ``best`` with placements under one choice, within ``limit`` nodes; with
        ``greedy``, only the first leaf (best-fit decreasing, no backtracking)."""
        descent = _Descent(self, H, main, best, limit)
        if greedy:
            descent.first_leaf()
            best.nodes += self.C
            return
        try:
            descent.visit(0)
        except _Stop:
            best.cut = True
        best.nodes += descent.nodes


class _Descent:
    """The depth-first search under one choice, and what it has placed so far.

    ``x[c][t]`` units of class ``c`` are on place ``t`` (accelerators ``0..k-1``, ``CPU``, ``DISK``)
    and ``rooms[t]`` is what ``t`` has left; ``res`` and ``disk`` are the bytes on the accelerators
    and on disk, ``stage`` the largest disk layer (the cpu keeps room to stage it), ``nodes`` the
    nodes visited (past ``limit``: :class:`_Stop`). A better placement is copied into ``best``.
    """

    __slots__ = (
        "C",
        "CPU",
        "DISK",
        "H",
        "allowed",
        "any_main",
        "best",
        "count",
        "disk",
        "forced_suffix",
        "k",
        "layer",
        "limit",
        "main",
        "members",
        "nodes",
        "res",
        "rooms",
        "size",
        "stage",
        "staged",
        "suffix",
        "x",
    )

    def __init__(self, search: _Search, H: int, main: int | None, best: Found, limit: int) -> None:
        """The start under choice ``(H, main)``: every room whole, nothing placed, no node visited."""
        k, C = search.k, search.C
        self.k, self.C, self.CPU, self.DISK = k, C, k, k + 1
        self.H, self.main, self.best, self.limit = H, main, best, limit
        self.any_main = search.any_main
        self.rooms = search.rooms(H, main)
        self.size, self.count, self.layer = search.size, search.count, search.layer
        self.members = search.members
        self.allowed = allowed = [search.where(c, H) for c in range(C)]
        self.staged = search.cpu is not None  # disk layers pass through the cpu
        # bytes of classes c.., and of those among them that may not leave the accelerators
        self.suffix = suffix = [0] * (C + 1)
        self.forced_suffix = forced_suffix = [0] * (C + 1)
        for c in range(C - 1, -1, -1):
            suffix[c] = suffix[c + 1] + search.vol[c]
            forced_suffix[c] = forced_suffix[c + 1] + (0 if any(allowed[c]) else search.vol[c])
        self.x = [[0] * (k + 2) for _ in range(C)]
        self.res = self.disk = self.nodes = self.stage = 0

    # -- the placement so far ---------------------------------------------------------------
    def leaf(self) -> None:
        """Every class is placed: copy the placement into ``best`` if it is better and one of the
        accelerators it uses can be the main device."""
        best, x, res, disk = self.best, self.x, self.res, self.disk
        if not (res > best.resident or (res == best.resident and disk < best.disk)):
            return
        C, CPU, DISK, H, main, rooms = self.C, self.CPU, self.DISK, self.H, self.main, self.rooms
        offloaded = any(x[c][CPU] or x[c][DISK] for c in range(C))
        used = [d for d in range(self.k) if any(x[c][d] for c in range(C))]
        chosen = None
        if offloaded and used and self.any_main:
            chosen = used[0]  # every used device keeps the headroom
        elif offloaded and used:
            if main is not None and main in used:
                chosen = main
            else:  # another used device with the headroom left over
                chosen = next((d for d in used if rooms[d] >= H), None)
                if chosen is None:
                    return
        layer = self.layer
        best.counts = [list(row) for row in x]
        best.members = self.members
        best.resident, best.disk = res, disk
        best.main = chosen
        best.headroom = max((layer[c] for c in range(C) if x[c][CPU] or x[c][DISK]), default=0)
        best.staging = self.stage

    def put(self, c: int, t: int, v: int) -> int:
        """Place ``v`` units of class ``c`` on ``t``; returns the stage it replaced."""
        used = v * self.size[c]
        self.rooms[t] -= used
        self.x[c][t] = v
        before = self.stage
        if t < self.k:
            self.res += used
        elif t == self.DISK:
            self.disk += used
            if v:
                self.stage = max(self.stage, self.layer[c])
        return before

    def take(self, c: int, t: int, v: int, before: int) -> None:
        """Undo :meth:`put` (``before``: the stage it returned)."""
        used = v * self.size[c]
        self.rooms[t] += used
        self.x[c][t] = 0
        if t < self.k:
            self.res -= used
        elif t == self.DISK:
            self.disk -= used
        self.stage = before

    # -- where a class may go ---------------------------------------------------------------
    def targets(self, c: int) -> tuple[list[int], list[int]]:
        """Places for class ``c`` in trial order, and how many fit on each."""
        k, CPU, DISK, H, main = self.k, self.CPU, self.DISK, self.H, self.main
        rooms, stage = self.rooms, self.stage
        s, m = self.size[c], self.count[c]
        on_cpu, on_disk = self.allowed[c]
        if s == 0:  # weightless: one place, the main device first
            spots = (([main] if main is not None else []) + list(range(k))) if H >= 0 else []
            spots = [d for d in spots if rooms[d] >= 0]  # (any_main: not on one too small for H)
            spots += [t for t, ok in ((CPU, on_cpu), (DISK, on_disk)) if ok]
            return spots[:1], [m] * len(spots[:1])
        order = sorted((d for d in range(k) if rooms[d] >= s), key=rooms.__getitem__)
        caps = [min(m, rooms[d] // s) for d in order]
        if on_cpu and rooms[CPU] - stage >= s:
            order.append(CPU)
            caps.append(min(m, (rooms[CPU] - stage) // s))
        if on_disk and rooms[DISK] >= s and self.stageable(c):
            order.append(DISK)
            caps.append(min(m, rooms[DISK] // s))
        return order, caps

    def stageable(self, c: int) -> bool:
        """Whether the cpu has room to stage class ``c`` (and every disk layer so far)."""
        return not self.staged or self.rooms[self.CPU] >= max(self.stage, self.layer[c])

    def on_cpu_counts(self, c: int, left: int, hi: int, lo: int, then_disk: bool) -> range | list[int]:
        """Counts of class ``c`` to try on the cpu, most first: when the rest would go to
        disk, the cpu must keep room to stage it, so only counts that leave that room."""
        if not (self.staged and then_disk):
            return range(hi, lo - 1, -1)
        room = self.rooms[self.CPU] - max(self.stage, self.layer[c])
        top = room // self.size[c]  # most that leaves the staging room
        counts = [left] if hi >= left else []  # all on the cpu: nothing to stage
        counts += range(min(hi, left - 1, top), lo - 1, -1)
        return counts

    # -- the search -------------------------------------------------------------------------
    def first_leaf(self) -> None:
        """Build only the first leaf: each class, largest first, as many as fit on each of its
        places in trial order, no backtracking (best-fit decreasing); keep it if all are placed."""
        CPU, DISK = self.CPU, self.DISK
        for c in range(self.C):
            left = self.count[c]
            order, caps = self.targets(c)
            for i, (t, cap) in enumerate(zip(order, caps, strict=True)):
                v = min(left, cap)
                if t == CPU:
                    v = next(iter(self.on_cpu_counts(c, left, v, 0, DISK in order[i + 1 :])), 0)
                if v and t == DISK and not self.stageable(c):
                    break
                self.put(c, t, v)
                left -= v
            if left:
                break
        else:
            self.leaf()

    def visit(self, c: int) -> None:
        """Place classes ``c``, ``c + 1``, ... every way the bounds leave open (at the end: a leaf)."""
        if c == self.C:
            self.leaf()
            return
        acc_room = sum(r for r in self.rooms[: self.k] if r > 0)
        if self.forced_suffix[c] > acc_room or self.cannot_improve(c):
            return
        m = self.count[c]
        self.place(_Turn(self, c, acc_room), 0, m, m, 0)

    def cannot_improve(self, c: int) -> bool:
        """Whether placing classes ``c``, ... cannot beat ``best``: even filled as well as they
        can be, the accelerators would hold too little."""
        s = self.size[c]
        if not s:
            return False
        later = self.suffix[c + 1]
        fill = 0  # a device fills with whole units of this class plus at most all smaller units
        for r in self.rooms[: self.k]:
            if r > 0:
                part = (r // s) * s + later
                fill += r if r < part else part
        more = self.count[c] * s + later
        bound = self.res + min(fill, more)
        best = self.best
        return bound < best.resident or (bound == best.resident and self.disk >= best.disk)

    def place(self, turn: _Turn, i: int, left: int, prev: int, placed: int) -> None:
        """One node: try each count of class ``turn.c`` on its place ``i`` that the bounds allow,
        most first, each followed by the rest of the class on places ``i + 1``, ....

        ``left`` units of the class are still to go, ``prev`` went to place ``i - 1`` and
        ``placed`` are on accelerators so far. (One method, not one per kind of place: each
        place is a level of the recursion, and this is the innermost loop of the search.)
        """
        self.nodes += 1
        if self.nodes > self.limit:
            raise _Stop
        if left == 0:
            self.visit(turn.c + 1)
            return
        fit_after = turn.fit_after
        if i == turn.n or fit_after[i] < left:
            return
        t = turn.order[i]
        if t == self.DISK and not self.stageable(turn.c):
            return
        cap = turn.caps[i]
        hi = cap if cap < left else left
        if turn.same[i] and prev < hi:
            hi = prev
        lo = left - fit_after[i + 1]
        if lo < 0:
            lo = 0
        best, s, later, acc_room = self.best, turn.s, turn.later, turn.acc_room
        base_res, base_disk = turn.base_res, turn.base_disk
        if t < self.k:
            rooms, row = self.rooms, turn.row
            free = acc_room - placed * s + turn.cpu_room  # room off the disk
            after = turn.acc_after[i + 1]
            for v in range(hi, lo - 1, -1):
                rest = left - v
                more = (placed + v + (rest if rest < after else after)) * s + later
                bound = base_res + (acc_room if acc_room < more else more)
                spill = rest * s + later - free + v * s
                disk_low = base_disk + (spill if spill > 0 else 0)
                if bound < best.resident or (bound == best.resident and disk_low >= best.disk):
                    break  # fewer here only lowers the bound
                used = v * s
                rooms[t] -= used
                row[t] = v
                self.res += used
                self.place(turn, i + 1, rest, v, placed + v)
                rooms[t] += used
                row[t] = 0
                self.res -= used
            return
        c, CPU, DISK = turn.c, self.CPU, self.DISK
        more = placed * s + later
        bound = base_res + (acc_room if acc_room < more else more)
        free = acc_room - placed * s + (turn.cpu_room if t == CPU else 0)
        counts = self.on_cpu_counts(c, left, hi, lo, i + 1 < turn.n) if t == CPU else range(hi, lo - 1, -1)
        for v in counts:
            spill = later - free + (v * s if t == CPU else 0)
            disk_low = base_disk + (left - v) * s + (v * s if t == DISK else 0) + (spill if spill > 0 else 0)
            if bound < best.resident or (bound == best.resident and disk_low >= best.disk):
                if t == CPU:
                    break  # fewer on the cpu only adds to the disk
                continue
            before = self.put(c, t, v)
            self.place(turn, i + 1, left - v, v, placed)
            self.take(c, t, v, before)


class _Turn:
    """One class's turn in the search: its places in trial order, how many fit on each, and the
    terms of the bounds that stay fixed while it is spread over them."""

    __slots__ = (
        "acc_after",
        "acc_room",
        "base_disk",
        "base_res",
        "c",
        "caps",
        "cpu_room",
        "fit_after",
        "later",
        "n",
        "order",
        "row",
        "s",
        "same",
    )

    def __init__(self, descent: _Descent, c: int, acc_room: int) -> None:
        """Class ``c``'s turn from where ``descent`` stands (``acc_room``: what its accelerators have left)."""
        k, main, rooms = descent.k, descent.main, descent.rooms
        self.c, self.s, self.later, self.acc_room = c, descent.size[c], descent.suffix[c + 1], acc_room
        self.order, self.caps = order, caps = descent.targets(c)
        self.n = n = len(order)
        # an accelerator with the same room as the one before (neither the main device) is
        # interchangeable with it: it takes no more units than that one did
        self.same = [
            0 < i
            and order[i] < k
            and rooms[order[i]] == rooms[order[i - 1]]
            and main not in order[i - 1 : i + 1]
            for i in range(n)
        ]
        # units that places i.. can still take: on accelerators, anywhere
        self.acc_after = acc_after = [0] * (n + 1)
        self.fit_after = fit_after = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            acc_after[i] = acc_after[i + 1] + (caps[i] if order[i] < k else 0)
            fit_after[i] = fit_after[i + 1] + caps[i]
        self.base_res, self.base_disk = descent.res, descent.disk
        self.cpu_room = max(rooms[descent.CPU] - descent.stage, 0)
        self.row = descent.x[c]


def search(
    sizes: Sequence[int],
    layers: Sequence[int],
    cpu_ok: Sequence[bool],
    disk_ok: Sequence[bool],
    caps: Sequence[int],
    cpu: int | None,
    disk: int | None,
    *,
    at_least: tuple[int, int] | None = None,
    nodes: int = SEARCH_NODES,
    any_main: bool = False,
) -> Found:
    """The placement with the most accelerator-resident bytes (then the fewest on disk).

    ``at_least`` is ``(resident, disk)`` of a placement already in hand: only a strictly
    better one is looked for. With ``any_main`` every accelerator that holds something keeps
    the offload headroom (stock dispatch may run the offloaded layers on any of them). Returns a :class:`Found` whose ``counts`` is ``None`` when nothing
    better (or nothing at all) was found; ``cut`` tells whether that is a proof.
    """
    s = _Search(sizes, layers, cpu_ok, disk_ok, caps, cpu, disk, any_main)
    best = Found()
    if at_least is not None:
        best.resident, best.disk = at_least
    todo = s.choices()
    for _, H, main in todo:  # every choice's best-fit-decreasing leaf first
        s.solve(H, main, best, 0, greedy=True)
    if s.C * (s.k + 4) > _DEPTH:  # too deep to branch: the best of those leaves
        best.cut = True
        return best
    # Then rounds with a growing node allowance per choice, best bound first, so that no choice
    # spends the budget on a proof before the others have offered their placements.
    allowance = 256
    while todo:
        left = []
        for choice in todo:
            bound, H, main = choice
            if bound < best.resident or (bound == best.resident and best.disk == 0):
                continue
            spare = nodes - best.nodes
            if spare <= 0:
                best.cut = True
                return best
            best.cut = False
            s.solve(H, main, best, min(allowance, spare))
            if best.cut:
                left.append(choice)
        todo = left
        allowance *= 8
    best.cut = False
    return best
