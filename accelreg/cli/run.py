"""``accelreg run [--devices IDS] -- COMMAND``: start a job's command under the registry.

It speaks the shell's language: a command that is not found exits 127 and one that cannot be
executed 126, each with one line on stderr; a malformed ``--devices`` is a usage error (2).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Any

from ..errors import DeviceError
from ..launch.job import devices_problem, run
from ._codes import EXIT_CANNOT_EXECUTE, EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

__all__ = ["add_parser", "cmd_run"]


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg run`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
        "run",
        help="start a job (torchrun, deepspeed, ray start, python ...) whose every Python process asks the registry",
        description="Replace this process with COMMAND, as a job of the registry: COMMAND and every "
        "process it starts get ACCELREG_RUN=1 in their environment, so every Python process among "
        "them (the launcher's own, its ranks, a scheduler's workers, on this node) installs "
        "accelreg's integrations when it first imports transformers, accelerate, peft, DeepSpeed, ... "
        "and a present but failing accelerator is an error there, never a silent cpu; a Python "
        "process there in which accelreg cannot work stops with one line and exit status 3. With "
        "--devices, the backend's visible-devices variable makes those physical devices the job's "
        "logical devices 0..n-1 (each rank then picks logical device LOCAL_RANK through "
        "accelreg.resolve()). The exit status and signals are COMMAND's own; a COMMAND that is not "
        "found exits 127, one that cannot be executed 126, as in a shell.",
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


def _usage(message: str) -> int:
    print(f"accelreg run: {message}", file=sys.stderr)
    return EXIT_USAGE


def _device_ids(text: str) -> list[int | str] | str:
    """``--devices`` as ids, or what is wrong with it (checked before anything is loaded; the
    backend's own parser judges the rest)."""
    ids: list[int | str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            return f"--devices {text!r}: an empty id (give ids separated by commas, e.g. 0,2)"
        if token.startswith("-") or any(c.isspace() for c in token):
            return (
                f"--devices {text!r}: {token!r} is not a device id (give ids separated by commas, e.g. 0,2)"
            )
        ids.append(int(token) if token.isdecimal() else token)
    return ids


def cmd_run(args: argparse.Namespace) -> int:
    """Check the devices, set the mask and replace this process with the command."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _usage(
            "give the command to start after --, e.g. accelreg run -- torchrun --nproc-per-node 2 train.py"
        )
    if args.backend is not None and args.devices is None:
        return _usage("--backend says whose devices --devices names; give --devices too")
    ids = None
    try:
        if args.devices is not None:
            ids = _device_ids(args.devices)
            if isinstance(ids, str):
                return _usage(ids)
            problem = devices_problem(args.backend, ids)  # the backend's own parser judges them
            if problem is not None:
                return _usage(f"--devices {args.devices!r}: {problem}")
        run(args.backend, ids, command)
    except DeviceError as exc:  # an unknown or unavailable backend, ids this machine does not have
        print(f"accelreg run: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        return _cannot_start(command[0], exc)
    return EXIT_OK  # pragma: no cover - run() replaces this process


def _cannot_start(program: str, exc: OSError) -> int:
    """One line and the shell's status for a command ``exec`` refused: 127 not found, 126 found
    but not executable."""
    if exc.errno == errno.ENOENT:
        if os.sep in program and os.path.lexists(program):  # the file is there: its #! interpreter is not
            print(
                f"accelreg run: cannot execute {program!r}: its #! interpreter was not found", file=sys.stderr
            )
            return EXIT_CANNOT_EXECUTE
        where = "no such file" if os.sep in program else "command not found (not on PATH)"
        print(f"accelreg run: {program}: {where}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if os.path.isdir(program):
        why = "it is a directory"
    elif exc.errno == errno.ENOEXEC:
        why = f"it is not a program and has no #! line (run it as `python {program}`, or give it a #! line)"
    elif exc.errno == errno.EACCES:
        why = f"permission denied (run it as `python {program}`, or `chmod +x` it)"
    else:
        why = exc.strerror or str(exc)
    print(f"accelreg run: cannot execute {program!r}: {why}", file=sys.stderr)
    return EXIT_CANNOT_EXECUTE
