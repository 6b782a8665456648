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
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .._warn import PREFIX
from ..errors import AccelregError, ConfigError, DeviceMapError, PluginError, UsageError
from ._codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PIPE, EXIT_USAGE
from ._format import did_you_mean, version_line

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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors say what was probably meant: a mistyped command
    (``accelreg evn``), option (``accelreg plan --max-memry``) or choice gets "did you mean"."""

    #: The parser of each command, so an unknown option is reported with that command's usage.
    commands: dict[str, argparse.ArgumentParser]
    #: The arguments being parsed (set by :func:`main`), to name a mistyped option that left a
    #: required argument missing (``accelreg plan --max-memry``).
    given: Sequence[str] = ()

    def error(self, message: str) -> Any:  # argparse's signature: it never returns
        m = _INVALID_CHOICE.fullmatch(message)
        if m is not None:
            message += did_you_mean(m.group("given"), re.findall(r"'([^']*)'", m.group("choices")))
        elif message.startswith("the following arguments are required"):
            mistyped = [a for a in self.given if a.startswith("--") and a != "--" and not self._known(a)]
            if mistyped:
                message = self._unknown_message(mistyped)
        super().error(message)

    def unknown(self, extras: list[str]) -> None:
        """Refuse ``extras`` (arguments no option took), suggesting this parser's close options."""
        self.error(self._unknown_message(extras))

    def _options(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings if o.startswith("--")]

    def _known(self, arg: str) -> bool:
        name = arg.partition("=")[0]
        return any(o.startswith(name) for o in self._options())  # argparse takes unique prefixes

    def _unknown_message(self, extras: list[str]) -> str:
        hints = [did_you_mean(e.partition("=")[0], self._options()) for e in extras if e.startswith("--")]
        return f"unrecognized arguments: {' '.join(extras)}{''.join(h for h in hints if h)}"


_INVALID_CHOICE = re.compile(
    r"argument .*: invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)"
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``accelreg`` argument parser: every command on it, or only ``command`` (one of
    :data:`COMMANDS`), which imports that command's module alone."""
    parser = _Parser(
        prog="accelreg",
        description="One registry for PyTorch accelerator backends.",
        epilog="Exit codes: 0 ok, 1 request failed, 2 usage error, 3 configuration or plugin error.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    parser.commands = dict(sub.choices)
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
    for each in (parser, *parser.commands.values()):  # type: ignore[attr-defined]
        each.given = argv  # type: ignore[attr-defined]
    args, extras = parser.parse_known_args(argv)
    if extras:  # with the usage of the command they were given to, not the top-level one
        parser.commands.get(args.command, parser).unknown(extras)  # type: ignore[attr-defined]
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
    """The command's exit status; accelreg's errors become one line on stderr and their code."""
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"accelreg {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
    except AccelregError as exc:  # any other refusal: the request failed, and says why
        print(f"accelreg {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
