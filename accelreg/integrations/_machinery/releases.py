"""Release ranges: which releases of a host library an adapter (or a whole integration) serves.

A range is written as PEP 440 specifier sets, alternatives joined by ``|``:
``">=1.10,<1.17"``, ``"~=4.57.0 | >=5.0,<5.13"``. Ranges are *declared* (the integrations table);
they never choose an adapter — a seam's shape does — but they say which releases were verified,
so an installed release outside them is named before anything is patched (the conflict report).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Releases"]


@dataclass(frozen=True)
class Releases:
    """A set of releases: PEP 440 specifier sets joined by ``|`` (any one may hold).

    Construction validates the text, so a typo in the table fails when the integration module is
    imported (a test imports them all), not in a user's job.
    """

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.parts():
            raise ValueError(f"a release range is a non-empty string, not {self.text!r}")
        for part in self.parts():
            if _clauses(part) is None:
                _specifier(part)  # raises ValueError on a malformed range

    def parts(self) -> list[str]:
        """The alternatives, each a PEP 440 specifier set."""
        return [p.strip() for p in self.text.split("|") if p.strip()] if isinstance(self.text, str) else []

    def __contains__(self, version: object) -> bool:
        """Whether ``version`` (a string) is in the range; an unparsable version is not."""
        from packaging.version import InvalidVersion, Version

        if not isinstance(version, str):
            return False
        final = _FINAL.fullmatch(version)
        if final:
            clauses = [_clauses(part) for part in self.parts()]
            if all(c is not None for c in clauses):
                release = _release(final.group(1))
                return any(all(test(release, bound) for test, bound in c) for c in clauses)  # type: ignore[union-attr]
        try:
            parsed = Version(version)
        except InvalidVersion:
            return False
        return any(_specifier(part).contains(parsed, prereleases=True) for part in self.parts())

    def __str__(self) -> str:
        return " | ".join(self.parts())

    def minors(self) -> list[str]:
        """The ``major.minor`` series the range reaches: what the static survey downloads one
        wheel of each (``~=4.57.0 | >=5.0,<5.3`` -> ``4.57, 5.0, 5.1, 5.2``). Every alternative
        must have a lower bound and an upper bound in the same major (the table's ranges do)."""
        out: list[str] = []
        for part in self.parts():
            lower = upper = None
            for spec in _specifier(part):
                major, minor = (int(x) for x in [*spec.version.split("."), "0"][:2])
                if spec.operator in (">=", "~=", "=="):
                    lower = (major, minor)
                if spec.operator in ("~=", "==", "<="):
                    upper = (major, minor + 1)
                elif spec.operator == "<":
                    upper = (major, minor)
            if lower is None or upper is None or upper[0] != lower[0]:
                raise ValueError(f"{part!r}: a survey needs both bounds in one major release")
            out += [f"{lower[0]}.{m}" for m in range(lower[1], upper[1]) if f"{lower[0]}.{m}" not in out]
        return out


#: A final release (``5.25.0``, ``2.13.0+cpu``): what an installed library nearly always is. Its
#: membership in a range of plain clauses is a comparison of number tuples (a local label is
#: ignored, as PEP 440 says for ranges without one), without importing ``packaging.specifiers``
#: (a few milliseconds of every rank's ``install()``); anything else (a pre-, post- or dev
#: release, a wildcard, ``!=``) is packaging's to decide.
_FINAL = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9}){0,4})(?:\+[a-z0-9]+(?:[._-][a-z0-9]+)*)?")
_CLAUSE = re.compile(r"\s*(>=|<=|==|~=|<|>)\s*([0-9]{1,9}(?:\.[0-9]{1,9}){0,4})\s*")
_TESTS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
}


def _release(text: str) -> tuple[int, ...]:
    """A final release's numbers, padded to five (``5.25`` == ``5.25.0``, as PEP 440 says)."""
    numbers = tuple(int(x) for x in text.split("."))
    return numbers + (0,) * (5 - len(numbers))


@functools.lru_cache(maxsize=256)
def _clauses(part: str) -> tuple[tuple[Callable[..., bool], tuple[int, ...]], ...] | None:
    """A specifier set of plain clauses (``>=5.0,<5.26``, ``~=4.57.0``) as (test, bound) pairs
    for final releases, or ``None`` where packaging must decide."""
    out: list[tuple[Callable[..., bool], tuple[int, ...]]] = []
    for clause in part.split(","):
        m = _CLAUSE.fullmatch(clause)
        if m is None:
            return None
        op, text = m.groups()
        if op == "~=":  # >= V and == V's prefix without its last number
            numbers = [int(x) for x in text.split(".")]
            if len(numbers) < 2:
                return None
            out.append((operator.ge, _release(text)))
            upper = [*numbers[:-2], numbers[-2] + 1]
            out.append((operator.lt, _release(".".join(map(str, upper)))))
        else:
            out.append((_TESTS[op], _release(text)))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _specifier(part: str) -> Any:  # packaging is imported on use (a cheap start-up)
    """The parsed specifier set (the table repeats a few ranges in every adapter: parsed once)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(part)
    except InvalidSpecifier as exc:
        raise ValueError(f"malformed release range {part!r}: {exc}") from None
