"""``accelreg config``: each effective setting, where it came from, and what it shadows."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import registry
from ..config import KEYS
from ._codes import EXIT_CONFIG, EXIT_OK
from ._format import table

__all__ = ["add_parser", "cmd_config"]


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg config`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
        "config",
        help="show each effective setting and where it came from",
        description="Each setting accelreg uses in this directory (priority, disable, providers, "
        "plugins, strict, probe_timeout, ...), its value, where it came from (an argument, an "
        "ACCELREG_* variable, the nearest accelreg.toml or pyproject.toml [tool.accelreg], the user's "
        "config file, or the default), and what a lower-precedence source also set for it.",
        epilog="Exit codes: 0 ok, 3 a configuration file was skipped (malformed TOML, a bad value; "
        "the problem is on stderr) or a variable is malformed. See docs/configuration.md.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace) -> int:
    """Print each setting with its source and the values lower-precedence sources also set for
    it (shadowed); exit 3 when a configuration file was skipped."""
    snap = registry.get()
    settings = snap.settings
    data = {
        "values": {
            key: {
                "value": _plain(getattr(settings, key)),
                "source": settings.sources.get(key, "default"),
                "shadowed": [
                    {"value": _plain(value), "source": source}
                    for source, value in settings.shadowed.get(key, ())
                ],
            }
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
        print(table(rows, ["setting", "value", "from", "variable"]))
        shadowed = [(key, item) for key, item in data["values"].items() if item["shadowed"]]
        if shadowed:
            print("\nshadowed (also set, but a source above wins):")
            for key, item in shadowed:
                for other in item["shadowed"]:
                    print(
                        f"  {key} = {_show(other['value'])}  from {other['source']}  (overridden by {item['source']})"
                    )
        if data["files"]:
            print("\nfiles read: " + ", ".join(data["files"]))
    sys.stdout.flush()  # the settings first, then what went wrong (on stderr, --json too)
    for problem in data["errors"]:
        print(f"accelreg config: error (file skipped): {problem}", file=sys.stderr)
    for problem in data["warnings"] if not args.json else ():
        print(f"accelreg config: warning: {problem}", file=sys.stderr)
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
