"""Values shown in messages: ``repr`` cut short, and never raising for a hostile value."""

from __future__ import annotations

from typing import Any

__all__ = ["short"]


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters.

    A huge int is described by its size (a 4,000-digit int is not worth printing, and Python
    refuses to print it), and a value whose ``repr()`` raises by its type.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned a non-string")
        text = str.__str__(text)
    except Exception:  # noqa: BLE001 - a hostile value (or a list holding a huge int): its type is enough
        return f"a {type(value).__name__} that cannot be printed"
    return text if len(text) <= limit else text[: limit - 3] + "..."
