"""``accelreg run [--devices IDS] -- COMMAND``: start a job's command under the registry.

It speaks the shell's language: a command that is not found (or whose ``#!`` interpreter is not)
exits 127 and one that cannot be executed 126, each with one line on stderr naming what is wrong;
an empty command name and a malformed ``--devices`` are usage errors (2).
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
        "found (or whose #! interpreter is not) exits 127, one that cannot be executed 126, as in a shell.",
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
    problem = _command_problem(command)
    if problem is not None:
        return _usage(problem)
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


def _command_problem(command: list[str]) -> str | None:
    """What makes ``command`` impossible to hand to ``exec`` at all, or ``None``."""
    if not command[0]:
        return (
            "the command name is empty (an unset shell variable after --?); give the command to "
            "start after --, e.g. accelreg run -- torchrun --nproc-per-node 2 train.py"
        )
    for i, arg in enumerate(command):
        if "\0" in arg:  # only from Python (cli.main): a process's own arguments cannot hold one
            return f"argument {i} of the command, {arg!r}, contains a NUL character"
    return None


def _cannot_start(program: str, exc: OSError) -> int:
    """One line and the shell's status for a command ``exec`` refused: 127 when it, or the ``#!``
    interpreter it names, is not found; 126 when it is found but cannot be executed."""
    bare = os.sep not in program
    if exc.errno == errno.ENOENT:
        import shutil  # only here: a plain `accelreg run` imports as little as it can

        # For a bare name exec searched PATH and reports its last entry: find the file ourselves.
        found = shutil.which(program) if bare else program if os.path.exists(program) else None
        if found is None:
            if bare:
                return _say(f"{program}: command not found (not on PATH)", EXIT_NOT_FOUND)
            if os.path.islink(program):
                return _say(
                    f"{program}: no such file (a symbolic link to {os.readlink(program)!r}, which does not exist)",
                    EXIT_NOT_FOUND,
                )
            return _say(f"{program}: no such file", EXIT_NOT_FOUND)
        return _say(f"cannot execute {program!r}: {_missing(found)}", EXIT_NOT_FOUND)  # as a shell: 127
    path = os.fsdecode(exc.filename) if exc.filename is not None else program  # PATH's hit, for a bare name
    interpreter = _interpreter(path) if exc.errno == errno.EACCES else None
    if os.path.isdir(path):
        if bare:  # a shell skips directories on PATH
            return _say(f"{program}: command not found (not on PATH; {path} is a directory)", EXIT_NOT_FOUND)
        why = "it is a directory"
    elif os.path.exists(path) and not os.path.isfile(path):
        why = "it is not a regular file (a named pipe, a device or a socket)"
    elif exc.errno == errno.ENOEXEC:
        why = f"it is not a program and has no #! line (run it as `python {program}`, or give it a #! line)"
    elif exc.errno == errno.EACCES and interpreter is not None and os.access(path, os.X_OK):
        if os.path.isdir(interpreter):
            why = f"its #! interpreter {interpreter!r} is a directory"
        elif not os.access(interpreter, os.X_OK):
            why = f"its #! interpreter {interpreter!r} is not executable"
        else:
            why = f"permission denied (to it, or to its #! interpreter {interpreter!r}; a file system mounted noexec?)"
    elif exc.errno == errno.EACCES and os.access(path, os.X_OK):
        why = "permission denied, though it has an execute bit (a file system mounted noexec?)"
    elif exc.errno == errno.EACCES:
        why = f"permission denied (run it as `python {program}`, or `chmod +x` it)"
    elif exc.errno == errno.ENOTDIR:
        why = "a part of its path is a file, not a directory"
    else:
        why = exc.strerror or str(exc)
    shown = f"{program!r} ({path})" if bare and path != program else repr(program)
    return _say(f"cannot execute {shown}: {why}", EXIT_CANNOT_EXECUTE)


def _say(line: str, code: int) -> int:
    print(f"accelreg run: {line}", file=sys.stderr)
    return code


def _interpreter(path: str) -> str | None:
    """The interpreter a ``#!`` line at the start of ``path`` names (as the kernel reads it: up
    to the first space or tab), or ``None``. Only a regular file is read (a named pipe would
    block)."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].lstrip(b" \t")
    name = line.replace(b"\t", b" ").split(b" ", 1)[0]
    return os.fsdecode(name) if name else None


def _missing(path: str) -> str:
    """Why an existing file ``exec`` says is not found cannot start: what its ``#!`` names."""
    interpreter = _interpreter(path)
    if interpreter is None:
        return "a file it needs to start is missing (a program built for another system, whose loader is not here?)"
    if interpreter.endswith("\r"):
        return (
            f"its #! interpreter {interpreter!r} was not found: the file has Windows line endings "
            "(convert it, e.g. with dos2unix)"
        )
    if os.path.exists(interpreter):
        return f"its #! interpreter {interpreter!r} cannot start (a file it needs, its own #! interpreter or loader, is missing)"
    return f"its #! interpreter {interpreter!r} was not found"
