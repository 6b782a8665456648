"""The deepspeed row's integration: the placement seam on ``deepspeed.initialize``, the
accelerator hand-over around ``enable()``/``disable()``, and what ``accelreg env`` shows."""

from __future__ import annotations

from typing import Any

from .._machinery import table
from .._machinery.seams import LIBRARIES, Integration, Seam
from .handover import accelerator_report, on_enable, take_back, unprepare
from .placement import attached, initialize

__all__ = ["INTEGRATION", "ROW", "disable", "enable", "enabled"]


# -- the integration ----------------------------------------------------------------------
def _status(integ: Integration, out: dict[str, Any]) -> None:
    """The placement rules attached, and whose accelerator DeepSpeed runs on (``accelreg env``)."""
    if integ.enabled and attached["models"]:
        out["note"] += (
            f"; placement rules attached to {attached['modules']} quantized modules "
            f"in {attached['models']} model(s)"
        )
    if integ.version() is None:
        return
    try:
        report = accelerator_report()
    except Exception as exc:  # noqa: BLE001 - a status line must not raise
        out["note"] += f"; DeepSpeed accelerator: unknown ({type(exc).__name__}: {exc})"
        return
    out["accelerator"] = report  # accelreg env prints report["summary"] as its own line


ROW = table.row("deepspeed")

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "deepspeed",
            "initialize",
            initialize,
            params=("args", "model", "optimizer"),
            why="attach the quantized-weight placement rules to the model before the engine is built",
        )
    ],
    scan_prefixes=LIBRARIES,
    on_enable=on_enable,
    on_disable=take_back,
    unprepare=unprepare,
    add_status=_status,
)


enable, disable, enabled = INTEGRATION.api()
