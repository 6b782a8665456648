"""``torch.accelerator`` follows the registry: one answer per process to "which accelerator".

``torch.accelerator`` is a second registry: the vendor runtime answers it (whichever runtime
registered itself with torch in this process), and it knows nothing of accelreg's
configuration. transformers, accelerate (1.16: ``get_torch_accelerator_backend``, its launcher,
its state, checkpointing, random seeding) and others ask it more every release, so a backend
the user disabled in accelreg (``ACCELREG_DISABLE=npu``), masked away, or ranked below another
one would still get their work.

Under ``install()`` this integration makes ``torch.accelerator``'s answers follow the registry
where the two disagree (docs/design-notes.md, "torch.accelerator follows the registry", says
why this rather than seaming each call site). Seam:
``torch.accelerator.current_accelerator`` — ``device_count()`` and ``is_available()`` call it
through the module's globals, so they follow too:

* the registry's current backend is an accelerator of another device type than torch's (or
  torch sees none yet): the registry's device type (``torch.device("emu")``), where torch has
  a device module for it;
* the registry says cpu and one of its backends has torch's device type (disabled, masked away,
  unavailable, or not chosen): ``None``, as torch answers on a machine without an accelerator;
* otherwise torch's own answer (the two agree; or a runtime no accelreg plugin describes, whose
  device type the registry has no opinion on: ``accelreg env`` says so).

Functions that address the current device of torch's accelerator runtime
(``current_device_index``, ``set_device_index``, ``synchronize``, streams, memory) stay
torch's: they agree whenever the registry's backend is torch's accelerator, which is the case
in every process with one accelerator runtime. Plugin code (a probe bringing a runtime up) sees
torch's own answers. :func:`report` compares the two for ``accelreg env``.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import registry
from ..errors import AccelregError
from ..registry import Snapshot
from ..registry.containment import inside_plugin
from .seams import Adapter, Integration, Seam, original

__all__ = ["INTEGRATION", "RELEASES", "disable", "enable", "enabled", "registry_answer", "report"]


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


def _current_accelerator(upstream: Any) -> Any:
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


def report(snap: Snapshot | None = None) -> dict[str, Any]:
    """torch.accelerator's own answer against the registry's, for ``accelreg env``.

    Keys: ``torch`` (torch's device type, or ``None``; ``"not installed"``), ``torch_devices``
    (its device count), ``registry`` (the registry's current backend) and
    ``registry_device_type``, ``agree``, ``why`` (the reason they disagree, or what they agree
    on), ``follows`` (whether torch.accelerator follows the registry in this process: the
    integration is enabled) and ``under_install`` (what torch.accelerator answers under
    ``install()``).
    """
    snap = registry.get() if snap is None else snap
    current = snap.current()
    out: dict[str, Any] = {
        "torch": None,
        "torch_devices": 0,
        "registry": current.name,
        "registry_device_type": None if current.name == "cpu" else current.device_type,
        "agree": True,
        "why": "",
        "follows": INTEGRATION.enabled,
        "under_install": None,
    }
    try:
        import torch
    except ImportError:
        out.update(torch="not installed", why="torch is not installed")
        return out
    module = getattr(torch, "accelerator", None)
    if module is None or not hasattr(module, "current_accelerator"):
        out.update(why=f"torch {torch.__version__} has no torch.accelerator")
        return out
    theirs = original(module.current_accelerator)()
    out["torch"] = None if theirs is None else theirs.type
    if theirs is not None:
        try:
            out["torch_devices"] = int(torch.get_device_module(theirs.type).device_count())
        except Exception:  # noqa: BLE001 - a report describes, it never raises
            out["torch_devices"] = 0
    follows = registry_answer(snap, theirs)
    out["under_install"] = None if follows is None else follows.type
    out["agree"] = out["torch"] == out["registry_device_type"]
    out["why"] = _why(snap, current, out["torch"])
    return out


def _why(snap: Snapshot, current: Any, theirs: str | None) -> str:
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


#: The torch releases this integration was verified with: the one every release set runs.
#: ``torch.accelerator.current_accelerator`` exists since torch 2.6 and the seam is matched by its
#: name and parameter, so an older or newer release is matched too, after the conflict report names it.
RELEASES = ">=2.13,<2.14"

INTEGRATION = Integration(
    name="torch_accelerator",
    distribution="torch",
    trigger="torch.accelerator",
    releases=RELEASES,
    tested={"oldest": "2.13.0", "middle": "2.13.0", "newest": "2.13.0"},
    seams=[
        Seam(
            "torch.accelerator",
            "current_accelerator",
            why="torch.accelerator (and its device_count/is_available) answers the registry's backend",
            adapters=(Adapter(RELEASES, _current_accelerator, params=("check_available",)),),
        ),
    ],
    scan_prefixes=("torch.accelerator",),
    # every process imports torch: its import must not make an armed process call install()
    follower=True,
)

enable, disable, enabled = INTEGRATION.api()
