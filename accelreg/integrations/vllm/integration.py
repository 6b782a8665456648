"""The vllm row's integration: its one seam, ``vllm.platforms.resolve_current_platform_cls_qualname``,
and the opt-in that makes the processes vLLM spawns install accelreg too."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from ... import flags
from .._machinery import table
from .._machinery.seams import Adapter, Integration, IntegrationWarning, Seam
from .selection import (
    _UNSET,
    ENV_PLATFORM,
    _distribution,
    _lock,
    _state,
    choice,
    choose,
)

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]

#: The start-up hook's opt-in (:mod:`accelreg.launch.startup`, a layer above), set for the
#: processes vLLM spawns.
_AUTO_INSTALL = "ACCELREG_AUTO_INSTALL"
_ARMING = ("ACCELREG_RUN", _AUTO_INSTALL)


# -- the seam -------------------------------------------------------------------------------
def _takes_no_arguments(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in params
    )


def _resolve(original: Any) -> Any:
    @functools.wraps(original)
    def resolve_current_platform_cls_qualname() -> str:
        return choose().qualname

    return resolve_current_platform_cls_qualname


def _armed() -> bool:
    # Read as the start-up hook reads them (accelreg.launch.startup.armed): accelreg.flags' words.
    return any(flags.env_switch(name) for name in _ARMING)


def _on_enable() -> None:
    """Arm the processes vLLM spawns, and say so when this process chose before accelreg could."""
    with _lock:
        if "armed" not in _state:
            _state["armed"] = _UNSET if _armed() else os.environ.get(_AUTO_INSTALL)
            if _state["armed"] is not _UNSET:
                os.environ[_AUTO_INSTALL] = "1"
    import sys

    platforms = sys.modules.get("vllm.platforms")
    already = getattr(platforms, "_current_platform", None) if platforms is not None else None
    if already is not None and choice() is None:
        import warnings

        warnings.warn(
            IntegrationWarning(
                f"accelreg: vLLM chose its platform ({type(already).__name__}) in this process before the vllm "
                "integration was enabled, and keeps it; call accelreg.install() before importing vllm, or run "
                "under `accelreg run` (the engine's spawned processes choose through the registry either way)"
            ),
            stacklevel=2,
        )


def _on_disable() -> None:
    with _lock:
        before = _state.pop("armed", _UNSET)
        if before is not _UNSET:
            if before is None:
                os.environ.pop(_AUTO_INSTALL, None)
            else:
                os.environ[_AUTO_INSTALL] = before
        _state.pop("choice", None)


INTEGRATION = Integration(
    **table.row("vllm").declared(_distribution()),
    seams=[
        Seam(
            "vllm.platforms",
            "resolve_current_platform_cls_qualname",
            why="vLLM's platform in every process is the one the registry's current backend declares",
            adapters=(Adapter(">=0.32,<0.33", _resolve, probe=_takes_no_arguments),),
            instead=f"run under `accelreg run`, or set VLLM_PLUGINS / VLLM_TARGET_DEVICE by hand (see {ENV_PLATFORM})",
        )
    ],
    # the function is vLLM's alone (no module imports it by name): its own package is the scan
    scan_prefixes=("vllm.platforms",),
    on_enable=_on_enable,
    on_disable=_on_disable,
)


enable, disable, enabled = INTEGRATION.api()
