"""The ``accelreg`` command: ``env``, ``config``, ``resolve``, ``run``, ``plan``.

One module per command (``env.py``, ``config.py``, ``resolve.py``, ``run.py``, ``plan.py``),
each with its ``add_parser`` and ``cmd_*`` functions; this module builds the parser, dispatches,
and turns accelreg's errors into the stable exit codes of :mod:`._codes`. A command's module is
imported when the parser needs it: ``accelreg run -- CMD``, paid once per job before CMD starts,
loads neither the planner nor the registry (``accelreg --help`` loads them all).

* 0 — success
* 1 — the request failed: ``resolve`` found no such device, ``plan`` found no fit
* 2 — usage error (bad arguments)
* 3 — configuration or plugin error (a malformed setting; any failure in strict mode)
* 141 — the reader of the output went away (``accelreg env | head``), as for any Unix tool
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .._warn import PREFIX
from ..errors import ConfigError, DeviceMapError, PluginError
from ._codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PIPE, EXIT_USAGE
from ._format import version_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .env import env_report

__all__ = [
    "COMMANDS",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "build_parser",
    "env_report",
    "main",
]


#: The commands, in the order ``accelreg --help`` lists them: each is this package's module of
#: that name, whose ``add_parser(subparsers)`` registers it.
COMMANDS = ("env", "config", "resolve", "run", "plan")


def __getattr__(name: str) -> Any:
    if name == "env_report":  # served from .env on first use, as the commands are
        value = importlib.import_module(f"{__name__}.env").env_report
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _VersionAction(argparse.Action):
    """``--version``: the line is worked out only when asked for (it reads package metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version line and exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_line())  # on stdout, as argparse's own version action
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``accelreg`` argument parser: every command on it, or only ``command`` (one of
    :data:`COMMANDS`), which imports that command's module alone."""
    parser = argparse.ArgumentParser(
        prog="accelreg",
        description="One registry for PyTorch accelerator backends.",
        epilog="Exit codes: 0 ok, 1 request failed, 2 usage error, 3 configuration or plugin error.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def _show_warning(
    message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """accelreg's own warnings as one line on stderr, without a source line from inside it."""
    text = str(message)
    if issubclass(category, RuntimeWarning) and text.startswith(PREFIX):
        print(f"accelreg: warning: {text[len(PREFIX) :]}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line).rstrip(), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; a reader that closes the pipe early (``| head``) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        # Like a Unix tool killed by SIGPIPE: no traceback, exit status 128 + 13. Python would
        # flush stdout again at exit and complain, so point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    with warnings.catch_warnings():
        # torch's import-time complaint when numpy is not installed (a core-only install):
        # `accelreg env` reports numpy itself, and no command needs it.
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
        if args.command in ("env", "config"):
            # Their reports list every warning already: say each once.
            warnings.filterwarnings("ignore", message="accelreg: ", category=RuntimeWarning)
        warnings.showwarning = _show_warning
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"accelreg: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except PluginError as exc:
        print(f"accelreg: plugin error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DeviceMapError as exc:
        print(f"accelreg: {exc}", file=sys.stderr)
        for line in exc.violations:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
