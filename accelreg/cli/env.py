"""``accelreg env``: every backend, why it is (un)available, what resolve() picks, the integrations."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import registry
from ..errors import AccelregError
from ..integrations import status as integration_status
from ..resolution import resolve_in
from ._codes import EXIT_OK
from ._format import table, terminal_width, version_line, versions, wrapped

__all__ = ["cmd_env", "env_report"]


def env_report() -> dict[str, Any]:
    """Everything ``accelreg env`` shows, as plain data."""

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
        "versions": versions(),
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
    assigned = snap.device_id is not None and snap.device_id[1].partition("=")[0].strip() == current.name
    if assigned and current.spec.indexed:
        var, value = snap.device_id
        why += f"; the device assigned by {var}={value} (its place in the mask)"
    elif snap.local_rank is not None and current.spec.indexed:
        var, value = snap.local_rank
        why += f"; index from {var}={value}"
    elif current.spec.indexed:
        why += "; index is the runtime's current device"
    return why


def _integrations() -> list[dict[str, Any]]:
    return integration_status()


def _integrations_scope(items: list[dict[str, Any]]) -> str:
    if any(i.get("enabled") or i.get("pending") for i in items):
        return "as enabled in this process"
    return (
        "per process, and none is enabled in this one; each line says what "
        "accelreg.install() would do in a process that calls it"
    )


def cmd_env(args: argparse.Namespace) -> int:
    """Print the report (``--json``: the data, schema-checked by the tests)."""
    report = env_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    width = terminal_width()

    def say(text: str = "") -> None:
        print(wrapped(text, width))

    say(version_line(report["versions"]))
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
    print(table(rows, ["#", "backend", "available", "devices", "provider", "visible devices", "why"], width))
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
