"""The ``accelreg`` command: ``env``, ``config``, ``resolve``, ``plan``.

Exit codes (stable, for scripts):

* 0 — success
* 1 — the request failed: ``resolve`` found no such device, ``plan`` found no fit
* 2 — usage error (bad arguments)
* 3 — configuration or plugin error (a malformed setting; any failure in strict mode)
* 141 — the reader of the output went away (``accelreg env | head``), as for any Unix tool
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import textwrap
import warnings
from collections.abc import Sequence
from typing import Any

from .errors import AccelregError, ConfigError, DeviceError, DeviceMapError, PluginError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 3
#: A reader closed the output pipe early (``accelreg env | head``): the status of a process
#: killed by SIGPIPE, without a traceback.
EXIT_PIPE = 141


def _table(rows: list[list[str]], header: list[str], width: int | None = None) -> str:
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


def _terminal_width() -> int | None:
    """Columns to fit: ``COLUMNS``, else the terminal's; ``None`` (no limit) for a pipe or file."""
    columns = shutil.get_terminal_size(fallback=(0, 0)).columns
    return columns if columns > 0 else None


def _wrapped(text: str, width: int | None) -> str:
    """``text`` wrapped to ``width``; continuation lines indented 4 past the line's own indent."""
    if width is None or len(text) <= width:
        return text
    body = text.lstrip(" ")
    indent = " " * (len(text) - len(body))
    lines = textwrap.wrap(
        body, width, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False
    )
    return "\n".join(lines) or text


def _versions() -> dict[str, str | None]:
    """accelreg's, torch's and Python's versions (torch's without importing it)."""
    from importlib import metadata

    from . import __version__

    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"accelreg": __version__, "torch": torch_version, "python": platform.python_version()}


# -- env ----------------------------------------------------------------------------------
def env_report() -> dict[str, Any]:
    """Everything ``accelreg env`` shows, as plain data."""
    from . import registry
    from .resolution import resolve_in

    snap = registry.get()
    backends = []
    for b in snap.order:
        info = b.info()
        probed = b.probe()
        var = info.visible_devices_var
        backends.append(
            {
                "name": info.name,
                "position": info.position,
                "provider": info.provider,
                "provider_version": info.provider_version,
                "builtin": info.builtin,
                "replaces": info.replaces,
                "plugin": info.plugin,
                "priority": info.priority,
                "available": info.available,
                "reason": info.reason,
                "device_count": info.device_count,
                "devices": list(info.devices()),
                "visible_devices_var": var,
                "visible_devices_value": snap.environ.get(var) if var else None,
                "visible_devices": list(info.visible_devices) if info.visible_devices is not None else None,
                "visible_devices_error": probed.visible_error,
            }
        )
    pick: dict[str, Any]
    try:
        device = resolve_in(snap, None)
        pick = {"device": str(device), "why": _why(snap, str(device))}
    except AccelregError as exc:
        pick = {"device": None, "error": str(exc)}
    s = snap.settings
    return {
        "versions": _versions(),
        "backends": backends,
        "priority": [b.name for b in snap.order],
        "priority_source": s.sources.get("priority", "default"),
        "resolve": pick,
        "failures": [f.__dict__ for f in snap.failures],
        "skipped": [{"plugin": p, "distribution": d, "why": w} for p, d, w in snap.skipped],
        "warnings": list(snap.warnings),
        "integrations": (integrations := _integrations()),
        "integrations_scope": _integrations_scope(integrations),
    }


def _why(snap: Any, device: str) -> str:
    current = snap.current()
    if current.name == "cpu":
        return "no accelerator is available, so the cpu"
    order = "configured priority" if snap.settings.priority else "default plugin priorities"
    why = f"{current.name} is the first available backend by {order}"
    if snap.local_rank is not None and current.spec.indexed:
        var, value = snap.local_rank
        why += f"; index from {var}={value}"
    elif current.spec.indexed:
        why += "; index is the runtime's current device"
    return why


def _integrations() -> list[dict[str, Any]]:
    try:
        from .integrations import status
    except ImportError:
        return []
    return status()


def _integrations_scope(items: list[dict[str, Any]]) -> str:
    if any(i.get("enabled") or i.get("pending") for i in items):
        return "as enabled in this process"
    return (
        "per process, and none is enabled in this one; each line says what "
        "accelreg.install() would do in a process that calls it"
    )


def _cmd_env(args: argparse.Namespace) -> int:
    report = env_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    width = _terminal_width()

    def say(text: str = "") -> None:
        print(_wrapped(text, width))

    say(_version_line(report["versions"]))
    say()
    rows = []
    for b in report["backends"]:
        provider = f"{b['provider']} {b['provider_version']}".strip()
        if b["replaces"]:
            provider += f" (replaces {b['replaces']})"
        visible = "-"
        if b["visible_devices_var"]:
            value = b["visible_devices_value"]
            if value is None:
                visible = f"{b['visible_devices_var']} unset"
            elif b["visible_devices_error"]:
                visible = f"{b['visible_devices_var']}={value!r}: invalid"
            else:
                mapping = ", ".join(f"{i}->{p}" for i, p in enumerate(b["visible_devices"]))
                visible = f"{b['visible_devices_var']}={value!r} [{mapping}]"
        rows.append(
            [
                str(b["position"]),
                b["name"],
                "yes" if b["available"] else "no",
                str(b["device_count"]),
                provider,
                visible,
                b["reason"],
            ]
        )
    print(_table(rows, ["#", "backend", "available", "devices", "provider", "visible devices", "why"], width))
    say()
    say(f"priority: {', '.join(report['priority'])}  (from {report['priority_source']})")
    pick = report["resolve"]
    if pick.get("device"):
        say(f"resolve(): {pick['device']}  ({pick['why']})")
    else:
        say(f"resolve(): error: {pick['error']}")
    for b in report["backends"]:
        if b["visible_devices_error"]:
            say(f"visible devices of {b['name']}: {b['visible_devices_error']}")
    if report["integrations"]:
        say()
        say(f"integrations: {report['integrations_scope']}")
        for item in report["integrations"]:
            state = "enabled" if item["enabled"] else "pending" if item.get("pending") else "not enabled"
            say(f"  {item['name']}: {state} ({item['library']} {item.get('version') or 'not installed'})")
            for line in (item.get("note"), item.get("install")):
                if line and line != "not installed":
                    say(f"      {line}")
            for seam in item.get("seams") or ():
                if seam.get("adapter") is None:
                    say(f"      skipped {seam['seam']}: {seam['reason']}")
            if item.get("accelerator"):  # DeepSpeed: whose accelerator it runs on
                say(f"      {item['accelerator']['summary']}")
    if report["skipped"]:
        say()
        say("skipped plugins:")
        for item in report["skipped"]:
            say(f"  {item['plugin']} ({item['distribution'] or 'unknown distribution'}): {item['why']}")
    if report["failures"]:
        say()
        say("plugin failures:")
        for f in report["failures"]:
            dist = f"{f['distribution']} {f['version']}".strip() or "unknown distribution"
            say(f"  {f['plugin']} ({dist}): {f['stage']}: {f['error']}")
    if report["warnings"]:
        say()
        say("warnings:")
        for w in report["warnings"]:
            say(f"  {w}")
    return EXIT_OK


# -- config -------------------------------------------------------------------------------
def _cmd_config(args: argparse.Namespace) -> int:
    from . import registry
    from .config import KEYS

    snap = registry.get()
    settings = snap.settings
    data = {
        "values": {
            key: {"value": _plain(getattr(settings, key)), "source": settings.sources.get(key, "default")}
            for key in KEYS
        },
        "files": list(settings.files),
        "errors": list(settings.errors),
        # unknown keys, and what selection found (names no plugin provides, providers)
        "warnings": [w for w in snap.warnings if w not in settings.errors],
    }
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        rows = [
            [key, _show(item["value"]), item["source"], KEYS[key].env] for key, item in data["values"].items()
        ]
        print(_table(rows, ["setting", "value", "from", "variable"]))
        if data["files"]:
            print("\nfiles read: " + ", ".join(data["files"]))
        for problem in data["errors"]:
            print(f"error (file skipped): {problem}")
        for problem in data["warnings"]:
            print(f"warning: {problem}")
    return EXIT_CONFIG if data["errors"] else EXIT_OK


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _show(value: Any) -> str:
    if value is None:
        return "(all)"
    if isinstance(value, list):
        return ", ".join(value) if value else "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) if value else "(none)"
    return str(value).lower() if isinstance(value, bool) else str(value)


# -- resolve ------------------------------------------------------------------------------
def _spec(text: str) -> Any:
    if text.isdecimal() and text.isascii():
        return int(text)
    if text.startswith("-") and text[1:].isdecimal():
        return int(text)
    return text


def _cmd_resolve(args: argparse.Namespace) -> int:
    from .resolution import resolve

    spec = _spec(args.spec) if args.spec is not None else None
    try:
        device = resolve(spec, backend=args.backend)
    except (DeviceError, TypeError) as exc:
        if args.json:
            print(
                json.dumps({"spec": args.spec, "device": None, "error": str(exc), "type": type(exc).__name__})
            )
        else:
            print(f"accelreg: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps({"spec": args.spec, "device": str(device)}))
    else:
        print(device)
    return EXIT_OK


# -- run ----------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    from .launch import run

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


# -- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelreg",
        description="One registry for PyTorch accelerator backends.",
        epilog="Exit codes: 0 ok, 1 request failed, 2 usage error, 3 configuration or plugin error.",
    )
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("env", help="show every backend, why it is (un)available, and what resolve() picks")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_env)

    p = sub.add_parser("config", help="show each effective setting and where it came from")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("resolve", help="resolve a device spec (auto, 0, npu, npu:1, cpu, ...)")
    p.add_argument("spec", nargs="?", default=None, help="device spec; default: auto")
    p.add_argument("--backend", help="resolve on this backend instead of the current one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_resolve)

    p = sub.add_parser(
        "run",
        help="start a command (torchrun, deepspeed, ...) with chosen physical devices masked in",
        description="Set the backend's visible-devices variable so that physical devices DEVICES become "
        "logical devices 0..n-1, then replace this process with COMMAND. Each rank then picks logical "
        "device LOCAL_RANK through accelreg.resolve().",
    )
    p.add_argument("--devices", required=True, help="physical device ids, comma-separated (e.g. 0,2)")
    p.add_argument("--backend", help="backend whose variable to set (default: the current backend)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run")
    p.set_defaults(func=_cmd_run)

    try:
        from .plan_cli import add_plan_parser
    except ImportError:
        pass
    else:
        add_plan_parser(sub)
    return parser


def _version_line(versions: dict[str, str | None] | None = None) -> str:
    """``accelreg 0.1.0 (torch 2.13.0+cpu, Python 3.11.7)``."""
    versions = versions or _versions()
    return (
        f"accelreg {versions['accelreg']} (torch {versions['torch'] or 'not installed'}, "
        f"Python {versions['python']})"
    )


def _show_warning(
    message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """accelreg's own warnings as one line on stderr, without a source line from inside it."""
    from ._warn import PREFIX

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
