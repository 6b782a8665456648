"""vLLM's section of ``accelreg env``: the version installed, the platform vLLM would run on for
the current backend and which platform serves each backend, and why, and every platform plugin
with its device type.

Without ``--vllm-activate`` (``report()``) nothing of vLLM's and no plugin is imported: the
entry points and vLLM's built-in names are read from the installed packages, and a platform
plugin's device type stays unknown (learning it runs the plugin's code), so a backend that a
plugin could serve by device type is reported as "not known". With it (``report(activate=True)``)
vLLM is imported and every platform plugin is loaded and activated, and each active one's
platform class imported, exactly as the choice in an engine's process does.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from importlib import metadata
from typing import Any

from ... import registry
from ...errors import AccelregError, DeviceError
from .selection import (
    _NAMES_REGISTRY,
    _REGISTRY_FACTORY,
    REGISTRY,
    Choice,
    PlatformPlugin,
    _allowed,
    _ask,
    _declared,
    _device_types,
    _distribution,
    _entry_points,
    _installed,
    _join,
    _overridden,
    _reason,
    _source,
    _target_cpu,
    choice,
    serve,
)

__all__ = ["ACTIVATE_FLAG", "report"]

#: The ``accelreg env`` option that activates the platform plugins to learn their device types.
ACTIVATE_FLAG = "--vllm-activate"

_STATIC = "what the registry would choose (read from the installed packages; nothing imported)"
_ACTIVATED = (
    f"what the registry would choose (vLLM imported, every platform plugin activated: {ACTIVATE_FLAG})"
)
_TARGET_CPU = "VLLM_TARGET_DEVICE=cpu asks for vLLM's own CPU platform"


def report(*, activate: bool = False) -> dict[str, Any]:
    """vLLM's section of ``accelreg env`` (``accelreg/schemas/env.schema.json``, ``vllm``).

    ``platform``: the choice made in this process, else what the registry would choose for its
    current backend; ``backends``: which platform serves each backend, and why; ``plugins``:
    every platform seen. With ``activate``, vLLM is imported and every platform plugin
    activated (its code runs) to learn the device types; without, nothing is imported."""
    dist = _distribution()
    try:
        version: str | None = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    out: dict[str, Any] = {"version": version, "distribution": dist if version else None}
    if version is None:
        out.update(scope="not installed", activated=False, platform=None, error=None, backends=[], plugins=[])
        return out
    snap = registry.get()
    if activate:
        platform, error, rows, plugins = _activated(snap)
    else:
        platform, error, rows, plugins = _static(snap)
    out.update(scope=_ACTIVATED if activate else _STATIC, activated=activate)
    made = choice()
    if made is not None:
        out["scope"] = "chosen in this process"
        platform, error = made.as_dict(), None
        rows = [_row(snap.backend(made.backend), made) if r["backend"] == made.backend else r for r in rows]
        plugins = [p.as_dict() for p in made.plugins]
    out.update(platform=platform, error=error, backends=rows, plugins=plugins)
    return out


def _row(b: Any, made: Choice | None = None, *, why: str = "", error: str | None = None) -> dict[str, Any]:
    """One backend's entry in ``backends``: the platform that serves it (``None``: not known,
    or an error)."""
    return {
        "backend": b.name,
        "device_type": b.spec.torch_type,
        "platform": made.platform if made is not None else None,
        "class": made.qualname if made is not None else "",
        "why": made.why if made is not None else why,
        "error": error,
    }


def _platform(made: Choice | None, b: Any, why: str) -> dict[str, Any]:
    """The top-level ``platform``: the choice, or ``platform: None`` with why it is not known."""
    if made is not None:
        return made.as_dict()
    return {"backend": b.name, "platform": None, "class": "", "why": why}


# -- activated: what an engine's process would choose ---------------------------------------
def _activated(
    snap: Any,
) -> tuple[dict[str, Any] | None, str | None, list[dict[str, Any]], list[dict[str, Any]]]:
    try:
        asked = _ask(snap)
        _device_types(asked)
        target = _target_cpu(asked)
    except AccelregError as exc:  # strict mode: a plugin's failure is an error
        return None, str(exc), [], []
    rows = []
    for b in snap.order:
        try:
            rows.append(_row(b, target or serve(asked, b, None)))
        except AccelregError as exc:
            rows.append(_row(b, error=str(exc)))
    platform: dict[str, Any] | None = None
    error: str | None = None
    b = snap.current()
    try:
        platform = (target or serve(asked, b, _reason(snap, b))).as_dict()
    except AccelregError as exc:
        error = str(exc)
    return platform, error, rows, [p.as_dict() for p in asked.seen.values()]


# -- static: read from the installed packages -----------------------------------------------
def _static(
    snap: Any,
) -> tuple[dict[str, Any] | None, str | None, list[dict[str, Any]], list[dict[str, Any]]]:
    seen = [PlatformPlugin(n, "vLLM", n, "vLLM's own") for n in _builtin_names_static()]
    allowed = _allowed()
    for ep in _entry_points():
        state = "left out by VLLM_PLUGINS" if allowed is not None and ep.name not in allowed else "installed"
        seen.append(PlatformPlugin(ep.name, _source(ep), ep.value, state))
    known = {p.name: p for p in seen}
    rows = []
    for b in snap.order:
        try:
            made, why = _static_choice(b, known, None)
            rows.append(_row(b, made, why=why))
        except DeviceError as exc:
            rows.append(_row(b, error=str(exc)))
    platform: dict[str, Any] | None = None
    error: str | None = None
    b = snap.current()
    try:
        made, why = _static_choice(b, known, _reason(snap, b))
        platform = _platform(made, b, why)
    except DeviceError as exc:
        error = str(exc)
    return platform, error, rows, [p.as_dict() for p in seen]


def _static_choice(b: Any, known: dict[str, PlatformPlugin], reason: str | None) -> tuple[Choice | None, str]:
    """What the registry would choose for ``b``, read from the installed packages: the choice,
    or ``(None, why)`` when it depends on platform plugins' device types, which are known only
    once they are activated. Raises :class:`DeviceError` as the choice would."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() == "cpu":
        return Choice("cpu", "cpu", "", _TARGET_CPU), ""
    names, who = _declared(b)
    if names == (REGISTRY,):
        return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, _join(reason, f"{who} {_NAMES_REGISTRY}")), ""
    if names and (_overridden() or any(_installed(n, known) for n in names)):
        return _static_declared(b, names, who, known, reason), ""
    kind = b.spec.torch_type
    what = (
        f"declares the vLLM platform(s) {', '.join(names)}, none of them installed here"
        if names
        else "declares no vLLM platform of its own"
    )
    candidates = sorted(p.name for p in known.values() if p.source != "vLLM" and p.state == "installed")
    if not candidates:
        if names:
            raise DeviceError(
                f"{who} {what}, and no vLLM platform plugin is installed; vLLM would not start under accelreg"
            )
        why = f"{who} {what}: accelreg's registry platform serves it (no vLLM platform plugin is installed)"
        return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, _join(reason, why)), ""
    otherwise = "accelreg's registry platform" if not names else "none: vLLM would not start under accelreg"
    why = (
        f"{who} {what}: the one active platform plugin whose device type is {kind!r} serves it, else "
        f"{otherwise}; the device types of {', '.join(candidates)} are known only once each is activated, "
        f"which runs its code (accelreg env {ACTIVATE_FLAG})"
    )
    return None, _join(reason, why)


def _static_declared(
    b: Any, names: tuple[str, ...], who: str, known: dict[str, PlatformPlugin], reason: str | None
) -> Choice:
    usable = [
        n
        for n in names
        if "." in n or n == REGISTRY or (n in known and known[n].state != "left out by VLLM_PLUGINS")
    ]
    if not usable:
        raise DeviceError(
            f"{who} declares the vLLM platform(s) {', '.join(names)}, but none is one of vLLM's own or an "
            f"installed platform plugin that VLLM_PLUGINS lets in; vLLM would not start under accelreg"
        )
    first = usable[0]
    where = (
        "a class path"
        if "." in first
        else "vLLM's own"
        if known.get(first) and known[first].source == "vLLM"
        else f"plugin of {known[first].source}"
        if first in known
        else "accelreg's registry platform"
    )
    more = f" (the first active of {', '.join(usable)})" if len(usable) > 1 else ""
    why = f"{who} declares the vLLM platform {first!r} ({where}){more}"
    return Choice(b.name, first, first if "." in first else "", _join(reason, why))


def _builtin_names_static() -> tuple[str, ...]:
    """The names of vLLM's built-in platform probes, read from ``vllm/platforms/__init__.py``
    without importing it (``builtin_platform_plugins``); empty when it cannot be read."""
    try:
        spec = importlib.util.find_spec("vllm")  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return ()
    bases = (spec.submodule_search_locations or ()) if spec is not None else ()
    path = next((p for b in bases if os.path.isfile(p := os.path.join(b, "platforms", "__init__.py"))), None)
    if path is None:
        return ()
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "builtin_platform_plugins" for t in targets):
            if isinstance(node.value, ast.Dict):
                return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return ()
