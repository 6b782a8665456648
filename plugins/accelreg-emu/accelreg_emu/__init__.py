"""accelreg-emu: an emulated multi-device, non-CUDA accelerator on the host.

Set ``ACCELREG_EMU_NAME`` (``emu``, ``npu``, ``mlu``, ``musa``, ``sdaa`` or ``hpu``) and the
emulator presents that many devices (``ACCELREG_EMU_DEVICES``, default 2) with memory
budgets (``ACCELREG_EMU_MEMORY``) as ``torch.<name>``. Under a vendor name the vendor's
package (``torch_npu``, ...) becomes importable in that process only, and importing it
activates the emulator, exactly as importing the real package brings up the real runtime.

``import accelreg_emu`` is cheap: torch is imported by :func:`activate` only.
"""

from __future__ import annotations

import threading
from typing import Any

from ._config import EmuConfig, EmuConfigError, read_config

__version__ = "0.2.0"
__all__ = ["EmuConfig", "EmuConfigError", "activate", "config", "is_active", "is_enabled"]

_lock = threading.RLock()
_active: EmuConfig | None = None


def config() -> dict[str, Any]:
    """Name, device count and capacities this process gets (or has, once active).

    Keys: ``name`` (``None`` when off), ``enabled``, ``devices`` (logical count), ``capacities``
    (bytes per logical device), ``physical_devices``, ``visible`` (physical ids behind logical
    indices), ``visible_devices_var``, ``active``, ``library`` (path, when active).
    """
    cfg = _active or read_config()
    out = cfg.as_dict()
    out["active"] = _active is not None
    if _active is not None:
        from ._build import library_path

        out["library"] = str(library_path(_variant(_active.name)))
    return out


def is_enabled() -> bool:
    """Whether ``ACCELREG_EMU_NAME`` asks for emulation (does not import torch)."""
    try:
        return read_config().enabled
    except EmuConfigError:
        return True  # a bad value is reported by activate(), not hidden


def is_active() -> bool:
    """Whether :func:`activate` has run in this process."""
    return _active is not None


def _variant(name: str | None) -> str:
    return "hpu" if name == "hpu" else "privateuse1"


def activate() -> EmuConfig:
    """Build (first use) and load the extension and register ``torch.<name>``; idempotent.

    Raises :class:`RuntimeError` when ``ACCELREG_EMU_NAME`` is unset, and
    :class:`EmuConfigError` for a bad setting.
    """
    global _active
    with _lock:
        if _active is not None:
            return _active
        cfg = read_config()
        if cfg.name is None:
            raise RuntimeError(
                "accelreg-emu: emulation is off; set ACCELREG_EMU_NAME=emu|npu|mlu|musa|sdaa|hpu"
            )
        from ._register import register

        register(cfg)
        _active = cfg
        return cfg
