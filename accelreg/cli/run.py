"""``accelreg run [--devices IDS] -- COMMAND``: start a job's command under the registry."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import DeviceError
from ..launch.job import run
from ._codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

__all__ = ["add_parser", "cmd_run"]


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg run`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
        "run",
        help="start a job (torchrun, deepspeed, ray start, python ...) whose every Python process asks the registry",
        description="Replace this process with COMMAND, as a job of the registry: every Python process "
        "COMMAND starts (the launcher's own, its ranks, a scheduler's workers, on this node) installs "
        "accelreg's integrations when it first imports transformers, accelerate, peft, DeepSpeed, ... "
        "and a present but failing accelerator is an error there, never a silent cpu. With --devices, "
        "the backend's visible-devices variable makes those physical devices the job's logical devices "
        "0..n-1 (each rank then picks logical device LOCAL_RANK through accelreg.resolve()). The exit "
        "status and signals are COMMAND's own.",
        epilog="Where the command cannot be wrapped (a cluster's own launch scripts), set "
        "ACCELREG_AUTO_INSTALL=1 in the job's environment instead: see docs/scaling.md.",
    )
    p.add_argument(
        "--devices", help="physical device ids to mask in, comma-separated (e.g. 0,2); default: no mask"
    )
    p.add_argument(
        "--backend", help="whose devices --devices names (default: the current backend); needs --devices"
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Check the devices, set the mask and replace this process with the command."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "accelreg run: give the command to start after --, e.g. accelreg run -- torchrun --nproc-per-node 2 train.py",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.backend is not None and args.devices is None:
        print(
            "accelreg run: --backend says whose devices --devices names; give --devices too", file=sys.stderr
        )
        return EXIT_USAGE
    ids = None
    if args.devices is not None:
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
