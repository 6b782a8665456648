"""``accelreg env``: what a bug report needs about this machine and what the registry makes of it.

The host (OS, Python, CPU, RAM), the libraries (numpy, transformers, accelerate, ...), the
configuration files read, every backend (why it is (un)available, its runtime's and driver's
versions as its plugin reports them), hardware that is here while its runtime or plugin is
missing (and what to install), each device (name, total and free memory, and the dtypes it
computes in, as :func:`accelreg.capabilities` answers), what ``resolve()`` picks, the
integrations, vLLM's platform (the one it would run on, what serves each backend, and every
platform plugin seen; ``--vllm-activate`` activates the plugins to learn their device types), the
open device branches of the installed host libraries for the current backend (the census:
docs/compat/census.md), plugin failures and warnings. ``--json`` prints the data
(``accelreg/schemas/env.schema.json``); ``--report`` prints a Markdown block of at most 100
columns to paste into a bug report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import textwrap
from importlib import metadata
from typing import Any

from .. import registry
from ..dtypes import COMPUTE_DTYPES
from ..errors import AccelregError
from ..integrations import census as integration_census
from ..integrations import status as integration_status
from ..integrations import table as integration_table
from ..integrations.torch import report as torch_accelerator_report
from ..integrations.vllm import report as vllm_report
from ..integrations.vllm.env_report import ACTIVATE_FLAG as VLLM_ACTIVATE
from ..launch import slurm
from ..registry.capabilities import capabilities as device_capabilities
from ..registry.hardware import seen as hardware_seen
from ..resolution import resolve_in
from ..sizes import format_size
from ._codes import EXIT_OK
from ._format import table, terminal_width, version_line, versions, wrapped

__all__ = [
    "LIBRARIES",
    "REPORT_WIDTH",
    "add_parser",
    "census_lines",
    "cmd_env",
    "env_report",
    "markdown_report",
    "slurm_lines",
]

#: Libraries whose versions a report lists (read from their metadata: nothing is imported).
LIBRARIES = (
    "transformers",
    "accelerate",
    "peft",
    "deepspeed",
    "bitsandbytes",
    "safetensors",
    "huggingface_hub",
    "tokenizers",
    "kernels",
    "lightning",
    "ray",
)
#: The widest line ``accelreg env --report`` prints.
REPORT_WIDTH = 100


def add_parser(subparsers: Any) -> None:
    """Register ``accelreg env`` on the ``accelreg`` command's subparsers."""
    p = subparsers.add_parser(
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
    p.add_argument(
        VLLM_ACTIVATE,
        action="store_true",
        dest="vllm_activate",
        help="import vLLM and activate every vLLM platform plugin (runs their code) to show each one's "
        "device type and which serves each backend; without it nothing of vLLM's is imported",
    )
    p.set_defaults(func=cmd_env)


def _version_of(distribution: str) -> str | None:
    """The installed version of an importable package, from its metadata (``None`` when it
    cannot be imported here: not installed, or hidden); nothing is imported."""
    try:
        if importlib.util.find_spec(distribution) is None:
            return None
        return metadata.version(distribution)
    except (ImportError, ValueError, metadata.PackageNotFoundError):
        return None


def env_report(*, hardware_root: str = "/", vllm_activate: bool = False) -> dict[str, Any]:
    """Everything ``accelreg env`` shows, as plain data (the ``--json`` output).

    ``hardware_root`` is where backends' hardware signatures look for device nodes, driver files
    and PCI devices (a test passes a fake machine's root). ``vllm_activate`` (``--vllm-activate``):
    import vLLM and activate its platform plugins to learn their device types."""

    snap = registry.get()
    vllm = vllm_report(activate=vllm_activate)  # first: a plugin's failure is in "failures"
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
                "versions": b.versions(),
                "device_info": _devices(b, info) if b.name != "cpu" else [],
                "capabilities": [
                    device_capabilities(b, index, device).as_dict()
                    for index, device in enumerate(info.devices())
                ],
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
        "versions": {**versions(), "numpy": _version_of("numpy")},
        "host": _host(snap),
        "libraries": {name: _version_of(name) for name in LIBRARIES},
        "config": {"files": list(s.files), "errors": list(s.errors), "warnings": list(s.warnings)},
        "backends": backends,
        "priority": [b.name for b in snap.order],
        "priority_source": s.sources.get("priority", "default"),
        "resolve": pick,
        "failures": [f.__dict__ for f in snap.failures],
        "skipped": [{"plugin": p, "distribution": d, "why": w} for p, d, w in snap.skipped],
        "warnings": list(snap.warnings),
        "integrations": (integrations := _integrations()),
        "integrations_scope": _integrations_scope(integrations),
        "torch_accelerator": _torch_accelerator(snap),
        "integration_failures": [f.as_dict() for f in integration_table.failures()],
        "slurm": slurm.report(snap.environ),
        "hardware": _hardware(snap, hardware_root),
        "vllm": vllm,
        "census": _census(snap),
    }


def _devices(b: Any, info: Any) -> list[dict[str, Any]]:
    """Each device of an available backend: its name and memory as the plugin reports them."""
    out = []
    for index, device in enumerate(info.devices()):
        memory = b.memory(index)
        out.append(
            {
                "device": device,
                "name": b.device_name(index),
                "total": memory.total if memory is not None else None,
                "free": memory.free if memory is not None else None,
            }
        )
    return out


def _dtype_table(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Rows ``[device, yes|no|unknown per dtype]`` for every device's compute dtypes, and one
    line per answer that is not "yes", saying why (once per backend, dtype and reason)."""
    words = {True: "yes", False: "no", None: "unknown"}
    rows: list[list[str]] = []
    notes: list[str] = []
    for b in report["backends"]:
        seen: set[tuple[str, str]] = set()
        for cap in b["capabilities"]:
            row = [cap["device"]]
            for name in COMPUTE_DTYPES:
                answer = cap["dtypes"].get(name)
                row.append(words[answer["supported"]] if answer else "-")
                if answer and answer["supported"] is not True and (name, answer["reason"]) not in seen:
                    seen.add((name, answer["reason"]))
                    notes.append(f"{b['name']} {name}: {answer['reason']}")
            rows.append(row)
    return rows, notes


def _host(snap: Any) -> dict[str, Any]:
    """OS, Python, CPU and RAM (the cpu backend's own name and memory probes)."""
    cpu = snap.backend("cpu")
    memory = cpu.memory(0)
    libc = " ".join(part for part in platform.libc_ver() if part) or None
    return {
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "cpu": cpu.device_name(0),
        "cpu_count": os.cpu_count(),
        "memory_total": memory.total if memory is not None else None,
        "memory_available": memory.free if memory is not None else None,
        "libc": libc,
    }


def _why(snap: Any, device: str) -> str:
    current = snap.current()
    if current.name == "cpu":
        return "no accelerator is available, so the cpu"
    order = "configured priority" if snap.settings.priority else "default plugin priorities"
    why = f"{current.name} is the first available backend by {order}"
    assigned = snap.device_id is not None and current.name in {
        entry.partition("=")[0].strip() for entry in snap.device_id[1].split(",")
    }
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


# -- torch.accelerator against the registry (issue 28) ---------------------------------------
def _torch_accelerator(snap: Any) -> dict[str, Any]:
    """torch.accelerator's own answer, the registry's, and why they differ (see
    :func:`accelreg.integrations.torch.report`)."""
    try:
        return torch_accelerator_report(snap)
    except Exception as exc:  # noqa: BLE001 - a report describes, it never raises
        return {"torch": None, "torch_devices": 0, "registry": snap.current().name, "registry_device_type": None,
                "agree": True, "why": f"could not ask torch.accelerator: {type(exc).__name__}: {exc}",
                "follows": False, "under_install": None}  # fmt: skip


def _torch_accelerator_lines(report: dict[str, Any]) -> list[str]:
    """One line when torch.accelerator and the registry agree; the disagreement and the rule
    that settles it otherwise."""
    item = report.get("torch_accelerator")
    if not item:
        return []
    if item["agree"]:
        return [f"torch.accelerator: agrees with the registry ({item['why']})"]
    then = item["under_install"] or "no accelerator"
    rule = (
        "follows the registry in this process" if item["follows"] else "follows it under accelreg.install()"
    )
    return [f"torch.accelerator: DISAGREES with the registry: {item['why']}", f"  it {rule}: {then}"]


# -- the census of device branches (issue 37) --------------------------------------------
def _census(snap: Any) -> dict[str, Any]:
    """The open device branches of the installed host libraries for the current backend's device
    type (see :func:`accelreg.integrations.census.report`); releases come from the libraries'
    metadata, nothing is imported."""
    current = snap.current()
    device_type = None if current.name == "cpu" else current.device_type
    versions: dict[str, str | None] = {}
    for library, (distributions, _) in integration_census.LIBRARIES.items():
        versions[library] = next((v for d in distributions if (v := _dist_version(d))), None)
    try:
        libraries = integration_census.report(versions, device_type)
    except Exception as exc:  # noqa: BLE001 - a report describes, it never raises
        return {"device_type": device_type, "page": integration_census.PAGE, "libraries": [],
                "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
    return {
        "device_type": device_type,
        "page": integration_census.PAGE,
        "libraries": libraries,
        "error": None,
    }


def _dist_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def census_lines(report: dict[str, Any]) -> list[tuple[int, str]]:
    """``(indent, text)``: per installed host library, the open device branches a device type it
    does not know meets (nothing when the current backend is the cpu)."""
    c = report.get("census")
    if not c or c["device_type"] is None:
        return []
    out = [(0, f"device branches for {c['device_type']} (the census: {c['page']})")]
    if c.get("error"):
        return [*out, (1, f"could not read the census: {c['error']}")]
    for item in c["libraries"]:
        head = f"{item['library']} {item['version']}"
        if item["open"] is None:
            out.append((1, f"{head}: not in the census (a release it did not read)"))
        elif item["known"]:
            out.append((1, f"{head} has its own branches for {c['device_type']}"))
        elif not item["open"]:
            out.append((1, f"{head}: no open site"))
        else:
            named = ", ".join(f"{s['file'].split('/', 1)[-1]} {s['function']}" for s in item["sites"])
            more = item["functions"] - len(item["sites"])
            out.append((1, f"{head}: {item['open']} open sites in {item['functions']} functions: {named}"
                        + (f" and {more} more" if more > 0 else "")))  # fmt: skip
    return out


# -- Slurm ---------------------------------------------------------------------------------
def slurm_lines(report: dict[str, Any]) -> list[str]:
    """What ``accelreg env`` says about the Slurm step it runs in (nothing outside one)."""
    s = report.get("slurm")
    if not s:
        return []
    tasks = f" of {s['tasks']}" if s["tasks"] else ""
    lines = [
        f"Slurm: job {s['job']}, step {s['step']}, task {s['task']}{tasks} (local {s['local_task']}) on {s['node']}"
    ]
    if s["error"]:
        return [*lines, f"Slurm allocation: cannot tell: {s['error']}"]
    gres = [
        f"{name} {','.join(g['ids']) if g['ids'] is not None else '(no device indices)'} (from {g['source']}"
        + (", this task's own)" if name in s["per_task"] else ")")
        for name, g in s["gres"].items()
    ]
    lines.append(f"Slurm allocated: {'; '.join(gres) if gres else 'no GRES of a backend installed here'}")
    state = "set" if s["applied"] else "not set in this process (`accelreg run` sets them)"
    for m in s["masks"]:
        how = "as Slurm set it" if m["set_by_slurm"] else f"from its {m['gres']} GRES"
        lines.append(f"Slurm mask for {m['backend']}: {m['variable']}={m['value']} ({how}; {state})")
    if s["device_id"]:
        lines.append(f"Slurm binds devices to this task: ACCELREG_DEVICE_ID={s['device_id']}")
    if s["ranks"]:
        lines.append("Slurm ranks: " + ", ".join(f"{k}={v}" for k, v in s["ranks"].items()))
    return lines


# -- hardware without its runtime (issue 31) ---------------------------------------------
def _hardware(snap: Any, root: str) -> list[dict[str, Any]]:
    """Each unavailable backend whose hardware its signature sees here: the hardware, what
    shows it, why the backend is unavailable, and what to install. Disabled backends are left
    out (disabling says "not here")."""
    out = []
    for b in snap.order:
        signature = b.spec.hardware
        if signature is None or b.blocked is not None or b.available:
            continue
        evidence = hardware_seen(signature, root)
        if evidence:
            out.append(
                {
                    "backend": b.name,
                    "what": signature.what,
                    "evidence": list(evidence),
                    "reason": b.probe().availability.reason,
                    "install": signature.install or None,
                }
            )
    return out


def _hardware_lines(report: dict[str, Any]) -> list[tuple[int, str]]:
    """``(indent, text)``: one line per backend whose hardware is here without its runtime."""
    out: list[tuple[int, str]] = []
    for item in report.get("hardware", ()):
        out.append(
            (
                0,
                f"{item['backend']}: {item['what']} found ({', '.join(item['evidence'])}), but "
                f"{item['backend']} is unavailable: {item['reason']}",
            )
        )
        if item["install"]:
            out.append((1, f"install {item['install']}"))
    return out


# -- shared wording -----------------------------------------------------------------------
def _size(nbytes: int | None) -> str:
    return "-" if nbytes is None else format_size(nbytes)


def _host_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` for the host and the libraries."""
    host, v = report["host"], report["versions"]
    python = f"{host['python']} ({host['python_implementation']}, {host['python_executable']})"
    ram = "unknown"
    if host["memory_total"] is not None:
        ram = f"{_size(host['memory_total'])} total, {_size(host['memory_available'])} available"
    found = [f"{name} {version}" for name, version in report["libraries"].items() if version]
    missing = [name for name, version in report["libraries"].items() if not version]
    libraries = ", ".join(found) or "none"
    if missing:
        libraries += f" (not installed: {', '.join(missing)})"
    return [
        ("OS", host["os"] + (f", {host['libc']}" if host["libc"] else "")),
        ("Python", python),
        ("CPU", host["cpu"] or "unknown"),
        ("RAM", ram),
        ("numpy", v["numpy"] or "not installed"),
        ("libraries", libraries),
    ]


def _config_lines(report: dict[str, Any]) -> list[str]:
    """Which configuration files were read, skipped (and why), and their other problems."""
    config = report["config"]
    lines = [f"read {', '.join(config['files'])}" if config["files"] else "no configuration file read"]
    lines += [f"SKIPPED {problem}" for problem in config["errors"]]
    lines += list(config["warnings"])
    return lines


def _priority_line(report: dict[str, Any]) -> str:
    source = report["priority_source"]
    errors = report["config"]["errors"]
    if errors and source == "default":
        n = len(errors)
        source += f"; {n} configuration file{'s' if n > 1 else ''} skipped, see config above"
    return f"priority: {', '.join(report['priority'])}  (from {source})"


def _resolve_line(report: dict[str, Any]) -> str:
    pick = report["resolve"]
    if pick.get("device"):
        return f"resolve(): {pick['device']}  ({pick['why']})"
    return f"resolve(): error: {pick['error']}"


def _versions_text(found: dict[str, str]) -> str:
    return ", ".join(f"{what} {version}" for what, version in found.items())


def _integration_lines(report: dict[str, Any]) -> list[tuple[int, str]]:
    """``(indent, text)`` lines about the integrations."""
    out: list[tuple[int, str]] = []
    for item in report["integrations"]:
        state = "enabled" if item["enabled"] else "pending" if item.get("pending") else "not enabled"
        out.append(
            (0, f"{item['name']}: {state} ({item['library']} {item.get('version') or 'not installed'})")
        )
        for line in (item.get("note"), item.get("install"), *(item.get("conflicts") or ())):
            if line and line != "not installed":
                out.append((1, line))
        for seam in item.get("seams") or ():
            if seam.get("adapter") is None:
                out.append((1, f"skipped {seam['seam']}: {seam['reason']}"))
        if item.get("accelerator"):  # DeepSpeed: whose accelerator it runs on
            out.append((1, item["accelerator"]["summary"]))
    for failure in report.get("integration_failures") or ():
        out.append((0, f"FAILED {failure['entry_point']} ({failure['distribution']}): {failure['reason']}"))
    return out


def _vllm_lines(report: dict[str, Any]) -> list[tuple[int, str]]:
    """``(indent, text)`` lines of the vLLM section: its version, the platform it would run on
    and why, and every platform plugin seen; none when vLLM is not installed."""
    v = report.get("vllm") or {}
    if not v.get("version"):
        return []
    out = [(0, f"vLLM {v['version']} ({v['distribution']}): {v['scope']}")]
    platform = v.get("platform")
    if platform:
        out.append((1, f"platform: {_vllm_platform(platform)} for backend {platform['backend']}"))
        out.append((1, f"why: {platform['why']}"))
    if v.get("error"):
        out.append((1, f"error: {v['error']}"))
    rows = v.get("backends") or ()
    if rows:
        out.append((1, "serves each backend:"))
    for row in rows:
        what = f"error: {row['error']}" if row.get("error") else _vllm_platform(row)
        out.append((2, f"{row['backend']} (device type {row['device_type']}): {what}"))
        if row.get("why"):
            out.append((3, f"why: {row['why']}"))
    for p in v.get("plugins") or ():
        if p.get("device_type"):
            kind = f"; device type {p['device_type']}"
        elif p["state"] == "installed":  # read statically: not activated
            kind = f"; device type not asked ({VLLM_ACTIVATE})"
        else:
            kind = ""
        out.append((1, f"plugin {p['name']} ({p['source']}, {p['value']}): {p['state']}{kind}"))
    return out


def _vllm_platform(item: dict[str, Any]) -> str:
    """A vLLM platform as the report names it: ``name (class)``, or that it is not known."""
    if item.get("platform") is None:
        return "not known without activating the platform plugins"
    cls = f" ({item['class']})" if item.get("class") else ""
    return f"{item['platform']}{cls}"


def _shown_warnings(report: dict[str, Any]) -> list[str]:
    """Warnings not already shown as configuration problems."""
    config = report["config"]
    shown = set(config["errors"]) | set(config["warnings"])
    return [w for w in report["warnings"] if w not in shown and not any(w.endswith(e) for e in shown)]


# -- the plain-text report ----------------------------------------------------------------
def cmd_env(args: argparse.Namespace) -> int:
    """Print the report (``--json``: the data, schema-checked by the tests; ``--report``: Markdown)."""
    report = env_report(vllm_activate=getattr(args, "vllm_activate", False))
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    if getattr(args, "report", False):
        print(markdown_report(report))
        return EXIT_OK
    width = terminal_width()

    def say(text: str = "") -> None:
        print(wrapped(text, width))

    say(version_line(report["versions"]))
    for line in _config_lines(report):
        say(f"config: {line}")
    say()
    rows = []
    for b in report["backends"]:
        provider = _provider(b)
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
        rows.append([*_backend_cells(b), provider, visible, b["reason"]])
    print(table(rows, ["#", "backend", "available", "devices", "provider", "visible devices", "why"], width))
    say()
    say(_priority_line(report))
    say(_resolve_line(report))
    for line in slurm_lines(report):
        say(line)
    for line in _torch_accelerator_lines(report):
        say(line)
    for b in report["backends"]:
        if b["visible_devices_error"]:
            say(f"visible devices of {b['name']}: {b['visible_devices_error']}")
    hardware = _hardware_lines(report)
    if hardware:
        say()
        say("hardware without its runtime (install what each line says to use it):")
        for indent, line in hardware:
            say(("  " if indent == 0 else "      ") + line)
    devices = [d for b in report["backends"] for d in b["device_info"]]
    if devices:
        say()
        device_rows = [[d["device"], d["name"] or "-", _size(d["total"]), _size(d["free"])] for d in devices]
        print(table(device_rows, ["device", "name", "total", "free"], width))
    dtype_rows, dtype_notes = _dtype_table(report)
    if dtype_rows:
        say()
        say("compute dtypes (accelreg.capabilities(); unknown: neither the plugin nor the runtime says):")
        print(table(dtype_rows, ["device", *COMPUTE_DTYPES], width))
        for note in dtype_notes:
            say(f"  {note}")
    runtimes = [b for b in report["backends"] if b["versions"]]
    if runtimes:
        say()
        say("runtime versions (as each backend's plugin reports them):")
        for b in runtimes:
            say(f"  {b['name']}: {_versions_text(b['versions'])}")
    say()
    for label, text in _host_lines(report):
        say(f"{label}: {text}")
    if report["integrations"]:
        say()
        say(f"integrations: {report['integrations_scope']}")
        for indent, line in _integration_lines(report):
            say(("  " if indent == 0 else "      ") + line)
    vllm_lines = _vllm_lines(report)
    if vllm_lines:
        say()
        for indent, line in vllm_lines:
            say(("  " * indent) + line)
    branches = census_lines(report)
    if branches:
        say()
        for indent, line in branches:
            say(("  " * indent) + line)
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
    others = _shown_warnings(report)
    if others:
        say()
        say("warnings:")
        for w in others:
            say(f"  {w}")
    return EXIT_OK


# -- the Markdown report ------------------------------------------------------------------
def _backend_cells(b: dict[str, Any]) -> list[str]:
    """A backend's first cells in both layouts: position, name, available, devices."""
    return [str(b["position"]), b["name"], "yes" if b["available"] else "no", str(b["device_count"])]


def _provider(b: dict[str, Any]) -> str:
    """The backend's provider and its version."""
    return f"{b['provider']} {b['provider_version']}".strip()


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[list[str]], header: list[str], width: int = REPORT_WIDTH) -> list[str]:
    """A Markdown table no wider than ``width``: the widest cells are cut (with ``...``) until
    every line fits."""
    cells = [[_cell(c) for c in row] for row in [header, *rows]]

    def lines() -> list[str]:
        out = ["| " + " | ".join(cells[0]) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return out

    while max(len(line) for line in lines()) > width:
        longest = max(((r, c) for r in range(1, len(cells)) for c in range(len(header))),
                      key=lambda rc: len(cells[rc[0]][rc[1]]))  # fmt: skip
        r, c = longest
        text = cells[r][c]
        if len(text) <= 8:
            break
        cut = len(text) - (max(len(line) for line in lines()) - width) - 3
        cells[r][c] = text[: max(cut, 5)].rstrip() + "..."
    return lines()


def _bullet(text: str, width: int = REPORT_WIDTH, level: int = 0) -> list[str]:
    indent = "  " * level
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent + "- ",
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=True,
    )


def markdown_report(report: dict[str, Any] | None = None, width: int = REPORT_WIDTH) -> str:
    """``accelreg env --report``: the report as Markdown, no line wider than ``width``, to
    paste into a bug report whole."""
    report = env_report() if report is None else report
    v = report["versions"]
    out = ["### Environment (`accelreg env --report`)", ""]
    out += _bullet(f"accelreg {v['accelreg']}, torch {v['torch'] or 'not installed'}", width)
    for label, text in _host_lines(report):
        out += _bullet(f"{label}: {text}", width)
    for line in _config_lines(report):
        out += _bullet(f"config: {line}", width)
    out += _bullet(_priority_line(report).replace("  (", " ("), width)
    out += _bullet(_resolve_line(report).replace("  (", " ("), width)
    for line in slurm_lines(report):
        out += _bullet(line, width)
    for line in _torch_accelerator_lines(report):
        out += _bullet(line.strip(), width)
    out += ["", "**Backends** (effective order)", ""]
    rows = [[*_backend_cells(b), _provider(b)] for b in report["backends"]]
    out += _md_table(rows, ["#", "backend", "available", "devices", "provider"], width)
    out.append("")
    for b in report["backends"]:
        text = f"{b['name']}: {b['reason']}"
        if b["replaces"]:
            text += f"; replaces {b['replaces']}"
        if b["visible_devices_value"] is not None:
            text += f"; {b['visible_devices_var']}={b['visible_devices_value']!r}"
            if b["visible_devices_error"]:
                text += f" (invalid: {b['visible_devices_error']})"
        if b["versions"]:
            text += f"; runtime: {_versions_text(b['versions'])}"
        out += _bullet(text, width)
    hardware = _hardware_lines(report)
    if hardware:
        out += ["", "**Hardware without its runtime**", ""]
        for indent, line in hardware:
            out += _bullet(line, width, indent)
    devices = [d for b in report["backends"] for d in b["device_info"]]
    if devices:
        out += ["", "**Devices**", ""]
        device_rows = [[d["device"], d["name"] or "-", _size(d["total"]), _size(d["free"])] for d in devices]
        out += _md_table(device_rows, ["device", "name", "total", "free"], width)
    dtype_rows, dtype_notes = _dtype_table(report)
    if dtype_rows:
        out += ["", "**Compute dtypes** (`accelreg.capabilities()`)", ""]
        out += _md_table(dtype_rows, ["device", *COMPUTE_DTYPES], width)
        for note in dtype_notes:
            out += _bullet(note, width)
    if report["integrations"]:
        out += ["", "**Integrations**", ""]
        out += _bullet(f"scope: {report['integrations_scope']}", width)
        for indent, line in _integration_lines(report):
            out += _bullet(line, width, indent)
    vllm_lines = _vllm_lines(report)
    if vllm_lines:
        out += ["", "**vLLM**", ""]
        for indent, line in vllm_lines:
            out += _bullet(line, width, indent)
    branches = census_lines(report)
    if branches:
        out += ["", f"**Device branches** for {report['census']['device_type']}: open sites", ""]
        out += _bullet(f"the census: {report['census']['page']}", width)
        for indent, line in branches[1:]:
            out += _bullet(line, width, indent - 1)
    for title, items in (
        ("Skipped plugins", [f"{i['plugin']} ({i['distribution'] or 'unknown distribution'}): {i['why']}" for i in report["skipped"]]),
        ("Plugin failures", [f"{f['plugin']} ({f['distribution']} {f['version']}): {f['stage']}: {f['error']}" for f in report["failures"]]),
        ("Warnings", _shown_warnings(report)),
    ):  # fmt: skip
        if items:
            out += ["", f"**{title}**", ""]
            for item in items:
                out += _bullet(item, width)
    return "\n".join(out)
