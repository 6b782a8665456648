"""Memory sizes: parse ``"20GiB"``, ``"500MB"``, ``"1.5 GB"`` or plain byte counts; format them back.

Units follow the usual convention (and accelerate's): ``KB``/``MB``/``GB``/``TB`` are powers of
1000, ``KiB``/``MiB``/``GiB``/``TiB`` powers of 1024, ``B`` (or no unit) is bytes. Units are
case-insensitive (``"20gib"`` is ``"20GiB"``) except that a lower-case ``b`` after a decimal
prefix (``"8Gb"``, ``"500mb"``) is rejected: accelerate reads it as *bits*, other tools as bytes,
so guessing would be wrong for someone.
Parsing is strict: a bool, a negative or non-finite number, an empty string, an unknown unit or
trailing junk raises :class:`ValueError` naming the value and the accepted forms.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

__all__ = ["UNITS", "format_size", "parse_size"]

#: Accepted units (upper-cased) and their factor in bytes.
UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
}
_SIZE = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]+))?\s*(?P<unit>[A-Za-z]*)"
)
_FORMS = "an int number of bytes or a string such as '20GiB', '500MB', '1.5 GB' or '1024'"


def parse_size(value: object, *, what: str = "size") -> int:
    """Bytes meant by ``value``: an ``int`` (bytes), a finite non-negative ``float`` (rounded down)
    or a string with an optional unit.

    Args:
        value: The size.
        what: What the size is for, used in error messages (``"max_memory['npu:0']"``).

    Raises:
        ValueError: ``value`` is not a size (the message names it and the accepted forms).
        TypeError: ``value`` has a type that is never a size (``bool``, ``None``, lists, ...).
    """
    if isinstance(value, bool):
        raise TypeError(f"{what}: {value!r} is a bool, not a size; use {_FORMS}")
    if isinstance(value, numbers.Integral):
        if value < 0:
            raise ValueError(f"{what}: {value!r} is negative; a size is a number of bytes >= 0")
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{what}: {value!r} is not a finite size >= 0; use {_FORMS}")
        return math.floor(number)
    if not isinstance(value, str):
        raise TypeError(f"{what}: cannot read a size from {type(value).__name__} {value!r}; use {_FORMS}")
    text = value.strip()
    m = _SIZE.fullmatch(text)
    if m is None:
        hint = " (sizes are never negative)" if text.startswith("-") else ""
        raise ValueError(f"{what}: {value!r} is not a size{hint}; use {_FORMS}")
    unit = m.group("unit")
    factor = UNITS.get(unit.upper())
    if factor is None:
        known = "B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB"
        raise ValueError(f"{what}: unknown unit {unit!r} in {value!r}; known units: {known}")
    if len(unit) == 2 and unit[1] == "b":
        raise ValueError(
            f"{what}: {value!r} is ambiguous (a lower-case 'b' means bits to accelerate); "
            f"write {unit.upper()} for bytes"
        )
    exponent = int(m.group("exp") or 0)
    if abs(exponent) > 30:
        raise ValueError(f"{what}: {value!r} is out of range")
    return math.floor(Fraction(m.group("num")) * Fraction(10) ** exponent * factor)


def format_size(nbytes: int | float, *, binary: bool = False) -> str:
    """A short readable size: ``"1.50 GB"``, ``"57.2 MB"``, ``"512 B"`` (``binary=True``: ``GiB``...).

    Decimal units by default, since budgets are usually written that way (``"60MB"``).
    """
    base, units = (
        (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))
        if binary
        else (1000, ("B", "KB", "MB", "GB", "TB", "PB"))
    )
    n = float(nbytes)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in units:
        if n < base or unit == units[-1]:
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.2f} {unit}" if n < 10 else f"{sign}{n:.1f} {unit}"
        n /= base
    raise AssertionError("unreachable")  # pragma: no cover
