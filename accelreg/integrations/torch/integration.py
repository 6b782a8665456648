"""The torch_accelerator row's integration: its one seam, ``torch.accelerator.current_accelerator``.

``torch.accelerator.current_accelerator`` exists since torch 2.6 and the seam is matched by its
name and parameter, so an older or newer release than the row's is matched too, after the
conflict report names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import registry
from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam, original
from .accelerator import current_accelerator, registry_answer, why

if TYPE_CHECKING:
    from ...registry import Snapshot

__all__ = ["INTEGRATION", "RELEASES", "ROW", "disable", "enable", "enabled", "report"]

ROW = table.row("torch_accelerator")
#: The torch releases this integration was verified with: the one every release set runs.
RELEASES = ROW.releases

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "torch.accelerator",
            "current_accelerator",
            why="torch.accelerator (and its device_count/is_available) answers the registry's backend",
            adapters=(Adapter(RELEASES, current_accelerator, params=("check_available",)),),
        ),
    ],
    scan_prefixes=("torch.accelerator",),
    # every process imports torch: its import must not make an armed process call install() (the
    # row is a follower)
)

enable, disable, enabled = INTEGRATION.api()


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
    out["why"] = why(snap, current, out["torch"])
    return out
