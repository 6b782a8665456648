"""``accelreg run [--devices IDS] -- COMMAND``: start a job's command under the registry."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import DeviceError
from ..launch import run
from ._codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

__all__ = ["add_run_parser", "cmd_run"]


def add_run_parser(subparsers: Any) -> None:
    """Register ``accelreg run`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
        "run",
        help="start a command (torchrun, deepspeed, ...) with chosen physical devices masked in",
        description="Set the backend's visible-devices variable so that physical devices DEVICES become "
        "logical devices 0..n-1, then replace this process with COMMAND. Each rank then picks logical "
        "device LOCAL_RANK through accelreg.resolve().",
    )
    p.add_argument("--devices", required=True, help="physical device ids, comma-separated (e.g. 0,2)")
    p.add_argument("--backend", help="backend whose variable to set (default: the current backend)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Check the devices, set the mask and replace this process with the command."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "accelreg run: give the command to start after --, e.g. accelreg run --devices 0,2 -- torchrun ...",
            file=sys.stderr,
        )
        return EXIT_USAGE
    ids = [int(i) if i.strip().isdecimal() else i.strip() for i in args.devices.split(",")]
    try:
        run(args.backend, ids, command)
    except (DeviceError, TypeError) as exc:
        print(f"accelreg run: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except FileNotFoundError as exc:
        print(f"accelreg run: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK  # pragma: no cover - run() replaces this process
