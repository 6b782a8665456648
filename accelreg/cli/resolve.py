"""``accelreg resolve SPEC``: the device a spec means in this process."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..errors import DeviceError
from ..resolution import resolve
from ._codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

__all__ = ["add_parser", "cmd_resolve"]


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg resolve`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
        "resolve",
        help="resolve a device spec (auto, 0, npu, npu:1, cpu, ...)",
        description="Print the torch device SPEC means in this process, as accelreg.resolve(SPEC) "
        "answers it: auto (the default) is the current backend's device for this process (LOCAL_RANK "
        "under a launcher), an int is that index of the current backend, a name or name:index is "
        "checked against that backend's availability and device count; cpu and meta pass through.",
        epilog="Exit codes: 0 ok, 1 SPEC names no device here (the message says what there is), 2 SPEC "
        "is not a device spec at all (npu:x, CPU, an empty string), 3 a configuration or plugin error.",
    )
    p.add_argument("spec", nargs="?", default=None, help="device spec; default: auto")
    p.add_argument("--backend", help="resolve on this backend instead of the current one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_resolve)


#: What a device spec looks like: an index, or a backend name with an optional index (``auto``,
#: ``cpu``, ``meta`` included). Anything else is bad input (exit 2), not a device this machine lacks.
_WELL_FORMED = re.compile(r"-?[0-9]+|[a-z0-9_]+(?::-?[0-9]+)?")


def _spec(text: str) -> Any:
    if text.isdecimal() and text.isascii():
        return int(text)
    if text.startswith("-") and text[1:].isdecimal():
        return int(text)
    return text


def cmd_resolve(args: argparse.Namespace) -> int:
    """Print the device ``args.spec`` resolves to (exit 1 when it names none, 2 when it is not a
    device spec at all)."""
    spec = _spec(args.spec) if args.spec is not None else None
    try:
        device = resolve(spec, backend=args.backend)
    except (DeviceError, TypeError) as exc:
        code = EXIT_FAILED if args.spec is None or _WELL_FORMED.fullmatch(args.spec) else EXIT_USAGE
        if args.json:
            print(
                json.dumps({"spec": args.spec, "device": None, "error": str(exc), "type": type(exc).__name__})
            )
        else:
            print(f"accelreg: {exc}", file=sys.stderr)
        return code
    if args.json:
        print(json.dumps({"spec": args.spec, "device": str(device)}))
    else:
        print(device)
    return EXIT_OK
