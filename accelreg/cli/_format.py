"""Plain-text layout shared by the commands: tables, wrapping to the terminal, the version line."""

from __future__ import annotations

import difflib
import platform
import shutil
import textwrap
from collections.abc import Sequence

from .. import __version__

__all__ = ["did_you_mean", "table", "terminal_width", "version_line", "versions", "wrapped"]


def table(rows: list[list[str]], header: list[str], width: int | None = None) -> str:
    """Left-aligned columns. Given a ``width`` the table does not fit in, the last column wraps
    within its place; when that leaves it under :data:`_MIN_WRAP` characters, the columns that do
    not fit go under each row as indented ``header: value`` lines, wrapped to ``width``."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(parts: list[str], ws: list[int]) -> str:
        return "  ".join(p.ljust(w) for p, w in zip(parts, ws, strict=False)).rstrip()

    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if width is None or lead + widths[-1] <= width:
        return "\n".join(
            [line(cells[0], widths), line(["-" * w for w in widths], widths)]
            + [line(r, widths) for r in cells[1:]]
        )
    if width - lead >= _MIN_WRAP:
        room = width - lead
        out = [
            line(cells[0], [*widths[:-1], room]),
            line(["-" * w for w in widths[:-1]] + ["-" * room], widths),
        ]
        for r in cells[1:]:
            parts = textwrap.wrap(r[-1], room, break_on_hyphens=False) or [""]
            out.append(line([*r[:-1], parts[0]], widths))
            out.extend(" " * lead + part for part in parts[1:])
        return "\n".join(out)
    keep = 1
    while keep < len(widths) and sum(widths[: keep + 1]) + 2 * keep <= width:
        keep += 1
    out = [line(cells[0][:keep], widths[:keep]), line(["-" * w for w in widths[:keep]], widths[:keep])]
    for r in cells[1:]:
        out.append(line(r[:keep], widths[:keep]))
        for name, value in zip(cells[0][keep:], r[keep:], strict=False):
            if value not in ("", "-"):
                out.extend(
                    textwrap.wrap(
                        f"{name}: {value}",
                        width,
                        initial_indent="    ",
                        subsequent_indent="      ",
                        break_on_hyphens=False,
                    )
                )
    return "\n".join(out)


#: The narrowest a wrapped last column of a table gets before columns move under the rows.
_MIN_WRAP = 24


def did_you_mean(given: str, known: Sequence[str]) -> str:
    """``" (did you mean 'env'?)"`` for the names in ``known`` close to ``given``, else ``""``."""
    close = difflib.get_close_matches(given, list(known), n=3, cutoff=0.6)
    if not close:
        close = [k for k in known if given and (k.startswith(given) or given.startswith(k))][:3]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def terminal_width() -> int | None:
    """Columns to fit: ``COLUMNS``, else the terminal's; ``None`` (no limit) for a pipe or file."""
    columns = shutil.get_terminal_size(fallback=(0, 0)).columns
    return columns if columns > 0 else None


def wrapped(text: str, width: int | None) -> str:
    """``text`` wrapped to ``width``; continuation lines indented 4 past the line's own indent."""
    if width is None or len(text) <= width:
        return text
    body = text.lstrip(" ")
    indent = " " * (len(text) - len(body))
    lines = textwrap.wrap(
        body, width, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False
    )
    return "\n".join(lines) or text


def versions() -> dict[str, str | None]:
    """accelreg's, torch's and Python's versions (torch's without importing it)."""
    from importlib import metadata  # tens of ms to import: `accelreg run` never asks

    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"accelreg": __version__, "torch": torch_version, "python": platform.python_version()}


def version_line(found: dict[str, str | None] | None = None) -> str:
    """``accelreg 0.2.0 (torch 2.13.0+cpu, Python 3.11.7)``."""
    found = found or versions()
    return (
        f"accelreg {found['accelreg']} (torch {found['torch'] or 'not installed'}, Python {found['python']})"
    )
