"""The ``accelreg`` command: ``env``, ``config``, ``resolve``, ``run``, ``plan``.

One module per command (``env.py``, ``config.py``, ``resolve.py``, ``run.py``, ``plan.py``),
each with its ``cmd_*`` function and (for ``plan``) its parser; this module builds the parser,
dispatches, and turns accelreg's errors into the stable exit codes of :mod:`._codes`:

* 0 — success
* 1 — the request failed: ``resolve`` found no such device, ``plan`` found no fit
* 2 — usage error (bad arguments)
* 3 — configuration or plugin error (a malformed setting; any failure in strict mode)
* 141 — the reader of the output went away (``accelreg env | head``), as for any Unix tool
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .._warn import PREFIX
from ..errors import ConfigError, DeviceMapError, PluginError
from ._codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PIPE, EXIT_USAGE
from ._format import version_line
from .config import cmd_config
from .env import cmd_env, env_report
from .plan import add_plan_parser
from .resolve import cmd_resolve
from .run import add_run_parser

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "build_parser",
    "env_report",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    """The ``accelreg`` argument parser, every command on it."""
    parser = argparse.ArgumentParser(
        prog="accelreg",
        description="One registry for PyTorch accelerator backends.",
        epilog="Exit codes: 0 ok, 1 request failed, 2 usage error, 3 configuration or plugin error.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "env",
        help="show every backend, why it is (un)available, and what resolve() picks",
        description="Every backend, why it is (un)available, its runtime's versions and devices, what "
        "resolve() picks, the configuration files read, the host (OS, Python, CPU, RAM) and the "
        "libraries: what a bug report needs.",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument(
        "--report",
        action="store_true",
        help="a Markdown block (at most 100 columns) to paste into a bug report",
    )
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("config", help="show each effective setting and where it came from")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("resolve", help="resolve a device spec (auto, 0, npu, npu:1, cpu, ...)")
    p.add_argument("spec", nargs="?", default=None, help="device spec; default: auto")
    p.add_argument("--backend", help="resolve on this backend instead of the current one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_resolve)

    add_run_parser(sub)
    add_plan_parser(sub)
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
    parser = build_parser()
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
