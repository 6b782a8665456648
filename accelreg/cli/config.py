"""``accelreg config``: each effective setting, where it came from, and what it shadows."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import registry
from ..config import KEYS
from ._codes import EXIT_CONFIG, EXIT_OK
from ._format import table

__all__ = ["add_parser", "cmd_config"]


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg config`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser("config", help="show each effective setting and where it came from")
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
