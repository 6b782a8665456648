"""What ``torch.accelerator`` answers under the registry, and the report comparing the two."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ... import registry
from ...errors import AccelregError
from ...registry.containment import inside_plugin

if TYPE_CHECKING:
    from ...registry import Snapshot

__all__ = ["current_accelerator", "registry_answer", "why"]


def registry_answer(snap: Snapshot, theirs: Any) -> Any:
    """What ``torch.accelerator.current_accelerator()`` answers under ``install()``, given
    torch's own answer ``theirs`` (a ``torch.device`` or ``None``)."""
    import torch

    current = snap.current()
    if current.name == "cpu":
        if theirs is not None and any(b.name != "cpu" and b.device_type == theirs.type for b in snap.order):
            return None  # the registry knows that device type and would not choose it
        return theirs
    if theirs is not None and theirs.type == current.device_type:
        return theirs
    if getattr(torch, current.device_type, None) is None:
        return theirs  # no torch device module for it: torch.accelerator could not serve it
    return torch.device(current.device_type)


#: ``(snapshot, {torch's device type or None: the answer})``: the answer depends on nothing else,
#: and torch.accelerator is asked on hot paths (a few microseconds each without this).
_memo: tuple[Any, dict[str | None, Any]] = (None, {})


def _answer(snap: Snapshot, theirs: Any) -> Any:
    global _memo
    owner, table = _memo
    if owner is not snap:
        table = {}
        _memo = (snap, table)
    key = None if theirs is None else theirs.type
    if key not in table:
        table[key] = registry_answer(snap, theirs)
    return table[key]


def current_accelerator(upstream: Any) -> Any:
    @functools.wraps(upstream)
    def current_accelerator(check_available: bool = False) -> Any:
        theirs = upstream(check_available) if check_available else upstream()
        if inside_plugin():
            return theirs  # a probe bringing a runtime up sees torch's own answer
        try:
            snap = registry.get()
        except AccelregError:
            return theirs  # a broken configuration raises where accelreg is asked directly
        return _answer(snap, theirs)

    return current_accelerator


def why(snap: Snapshot, current: Any, theirs: str | None) -> str:
    mine = (
        "cpu (no accelerator)"
        if current.name == "cpu"
        else f"{current.name} (device type {current.device_type})"
    )
    if theirs == (None if current.name == "cpu" else current.device_type):
        return f"both answer {mine}"
    if theirs is None:
        return (
            f"torch.accelerator sees no accelerator, the registry chose {mine}: {current.name}'s runtime "
            "is not registered with torch as its accelerator in this process"
        )
    owners = [b for b in snap.order if b.name != "cpu" and b.device_type == theirs]
    if not owners:
        return (
            f"torch.accelerator answers {theirs}, which no accelreg backend declares (a runtime without an "
            f"accelreg plugin); the registry chose {mine}"
        )
    reasons = []
    for b in owners:
        if b.blocked is not None:
            reasons.append(f"{b.name} is {b.blocked}")
        elif not b.available:
            reasons.append(f"{b.name} is unavailable to the registry ({b.probe().availability.reason})")
        else:
            order = ", ".join(x.name for x in snap.order)
            reasons.append(f"{b.name} is available but ranked after {current.name} (priority: {order})")
    return f"torch.accelerator answers {theirs}, the registry chose {mine}: " + "; ".join(reasons)
