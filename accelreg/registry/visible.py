"""Parsing of visible-device variables (``CUDA_VISIBLE_DEVICES`` and its vendor cousins).

A visible-devices value lists, in logical order, the physical devices a process may use:
``"2,0"`` means logical 0 is physical 2 and logical 1 is physical 0. Runtimes differ in what
they accept (UUIDs, ``device.subdevice`` pairs) and in what they do with a bad entry, so each
backend picks the parser matching its runtime.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import ConfigError

__all__ = ["mask_value", "parse_visible_devices", "parse_visible_devices_truncating"]

#: Values that mean "no device at all" (SLURM writes NoDevFiles when a job has no GPUs).
_NO_DEVICES = {"", "nodevfiles", "none", "void"}
_INDEX = re.compile(r"0|[1-9][0-9]{0,5}")
_SUBDEVICE = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})")
_RANGE = re.compile(r"(0|[1-9][0-9]{0,5})-(0|[1-9][0-9]{0,5})")
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/_-]{0,127}")


def parse_visible_devices(
    value: str,
    *,
    var: str = "visible devices",
    subdevices: bool = False,
    ranges: bool = False,
    uuids: bool = False,
) -> tuple[str, ...]:
    """Physical ids behind each logical index, strictly.

    ``""`` and ``"NoDevFiles"`` mean no device. Entries are non-negative decimal ids; with
    ``subdevices`` also ``"1.0"`` (device.tile), with ``ranges`` also ``"0-3"``, with ``uuids``
    also ``GPU-...``/``MIG-...``. A malformed, negative or repeated entry raises
    :class:`~accelreg.errors.ConfigError` naming ``var``: accelreg will not guess what a
    runtime makes of it.
    """
    out: list[str] = []
    for token in _tokens(value, var):
        expanded = _expand(token, subdevices=subdevices, ranges=ranges, uuids=uuids)
        if expanded is None:
            raise ConfigError(
                f"{var}={value!r}: {token!r} is not a device id{_accepts(subdevices, ranges, uuids)}"
            )
        for item in expanded:
            if item in out:
                raise ConfigError(f"{var}={value!r}: device {item} is listed twice")
            out.append(item)
    return tuple(out)


def _tokens(value: str, var: str) -> list[str]:
    """The comma-separated entries of a visible-devices value, stripped; none for a value that
    means "no device at all"."""
    if not isinstance(value, str):
        raise TypeError(f"{var} must be a string, got {type(value).__name__}")
    text = value.strip()
    if text.lower() in _NO_DEVICES:
        return []
    return [raw.strip() for raw in text.split(",")]


def _expand(token: str, *, subdevices: bool, ranges: bool, uuids: bool) -> list[str] | None:
    if _INDEX.fullmatch(token):
        return [token]
    if subdevices and _SUBDEVICE.fullmatch(token):
        return [token]
    if uuids and _UUID.fullmatch(token):
        return [token]
    if ranges:
        m = _RANGE.fullmatch(token)
        if m and int(m.group(1)) <= int(m.group(2)):
            return [str(i) for i in range(int(m.group(1)), int(m.group(2)) + 1)]
    return None


def _accepts(subdevices: bool, ranges: bool, uuids: bool) -> str:
    kinds = ["non-negative integers"]
    if subdevices:
        kinds.append("device.subdevice pairs")
    if ranges:
        kinds.append("ranges a-b")
    if uuids:
        kinds.append("GPU-/MIG- UUIDs")
    return f" (accepted: {', '.join(kinds)})"


def parse_visible_devices_truncating(value: str, *, var: str) -> tuple[str, ...]:
    """A mask read the way the CUDA runtime reads ``CUDA_VISIBLE_DEVICES``.

    Such a runtime takes entries up to the first invalid one (a negative, malformed or repeated
    id) and ignores the rest, so ``"0,-1,1"`` exposes only device 0; it never refuses a value.
    Entries are integers or ``GPU-``/``MIG-`` UUIDs (possibly abbreviated). The built-in cuda
    backend uses it for its variable.
    """
    out: list[str] = []
    for token in _tokens(value, var):
        if not (_INDEX.fullmatch(token) or _UUID.fullmatch(token)) or token in out:
            break
        out.append(token)
    return tuple(out)


def mask_value(ids: Sequence[int | str]) -> str:
    """The variable value that makes ``ids`` (physical ids) logical devices 0..n-1."""
    out: list[str] = []
    for item in ids:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TypeError(f"device ids must be int or str, got {item!r}")
        token = str(item).strip()
        if isinstance(item, int) and item < 0:
            raise ConfigError(f"device id {item} is negative")
        if not token or "," in token:
            raise ConfigError(f"{item!r} is not a device id")
        if token in out:
            raise ConfigError(f"device {token} is listed twice")
        out.append(token)
    return ",".join(out)
