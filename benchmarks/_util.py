"""Small timing helpers shared by the benchmarks: medians of repeated runs, side by side."""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable


def per_call_ns(fn: Callable[[], object], *, number: int = 200_000, repeat: int = 9) -> float:
    """Median over ``repeat`` runs of the mean time of one call, in nanoseconds."""
    runs = timeit.repeat(fn, number=number, repeat=repeat)
    return statistics.median(runs) / number * 1e9


def interleaved_ns(
    stmts: dict[str, str], namespace: dict[str, object], *, number: int = 200_000, repeat: int = 9
) -> dict[str, float]:
    """Time statements in alternation (so machine noise hits all alike); medians in ns/call.

    Statements (not lambdas) are timed, so no extra call layer is added to any of them.
    """
    samples: dict[str, list[float]] = {k: [] for k in stmts}
    for _ in range(repeat):
        for name, stmt in stmts.items():
            samples[name].append(timeit.timeit(stmt, globals=namespace, number=number) / number * 1e9)
    return {k: statistics.median(v) for k, v in samples.items()}
