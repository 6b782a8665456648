"""Release ranges: which releases of a host library an adapter (or a whole integration) serves.

A range is written as PEP 440 specifier sets, alternatives joined by ``|``:
``">=1.10,<1.17"``, ``"~=4.57.0 | >=5.0,<5.13"``. Ranges are *declared* (the integrations table);
they never choose an adapter — a seam's shape does — but they say which releases were verified,
so an installed release outside them is named before anything is patched (the conflict report).
"""

from __future__ import annotations

import functools
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
            _specifier(part)  # raises ValueError on a malformed range

    def parts(self) -> list[str]:
        """The alternatives, each a PEP 440 specifier set."""
        return [p.strip() for p in self.text.split("|") if p.strip()] if isinstance(self.text, str) else []

    def __contains__(self, version: object) -> bool:
        """Whether ``version`` (a string) is in the range; an unparsable version is not."""
        from packaging.version import InvalidVersion, Version

        if not isinstance(version, str):
            return False
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


@functools.lru_cache(maxsize=256)
def _specifier(part: str) -> Any:  # packaging is imported on use (a cheap start-up)
    """The parsed specifier set (the table repeats a few ranges in every adapter: parsed once)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(part)
    except InvalidSpecifier as exc:
        raise ValueError(f"malformed release range {part!r}: {exc}") from None
