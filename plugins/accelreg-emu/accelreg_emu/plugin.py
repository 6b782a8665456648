"""The accelreg plugin (entry point ``emu`` in group ``accelreg``).

It yields one backend named after ``ACCELREG_EMU_NAME``: ``emu`` at priority 5, or a vendor
name at that vendor's usual priority, replacing accelreg's built-in plugin for the name.
Probes are cheap and contained: with ``ACCELREG_EMU_NAME`` unset nothing is built, loaded
or imported (not even torch), and the backend reports why it is unavailable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pluggy

from ._config import COLLECTIVES, PRIORITIES, VISIBLE_VARS, EmuConfigError, host_memory, read_config

try:
    from accelreg.types import Availability, BackendSpec, MemoryInfo
except ImportError:  # pragma: no cover - accelreg-emu also works without accelreg
    Availability = BackendSpec = MemoryInfo = None  # type: ignore[assignment,misc]

# accelreg.hookimpl is pluggy.HookimplMarker("accelreg"); an identical marker made here lets
# this module load without importing accelreg's registry (the two are interchangeable).
hookimpl = pluggy.HookimplMarker("accelreg")

_OFF = "emulation is off: set ACCELREG_EMU_NAME=emu|npu|mlu|musa|sdaa|hpu"


def _is_available() -> Availability:
    try:
        cfg = read_config()
    except EmuConfigError as exc:
        return Availability.no(f"accelreg-emu misconfigured: {exc}")
    if not cfg.enabled:
        return Availability.no(_OFF)
    if cfg.device_count == 0:
        return Availability.no(f"{cfg.visible_devices_var} hides every emulated device")
    import accelreg_emu

    accelreg_emu.activate()
    return Availability.yes(f"{cfg.device_count} emulated device(s) via accelreg-emu")


def _device_count() -> int:
    cfg = read_config()
    if not cfg.enabled:
        return 0
    import accelreg_emu

    accelreg_emu.activate()
    return cfg.device_count


def _current_index() -> int:
    import torch

    return int(torch.ops.accelreg_emu.current_device())


def _memory_info(index: int) -> MemoryInfo | None:
    import accelreg_emu

    if not accelreg_emu.is_active():
        return None
    import torch

    total = int(torch.ops.accelreg_emu.capacity(index))
    used = int(torch.ops.accelreg_emu.memory_allocated(index))
    return MemoryInfo(free=max(total - used, 0), total=total)


def _hpu_device(index: int):
    import torch

    return torch.device("hpu")


def _device_name(index: int) -> str:
    """``accelreg-emu NPU 0 (emulated on the host)``; it says so when the devices were given more
    memory (``ACCELREG_EMU_MEMORY``) than the host has."""
    where = "emulated on the host"
    try:
        cfg = read_config()
    except EmuConfigError:
        cfg = None
    host = host_memory()
    if cfg is not None and host and cfg.oversubscribed(host):
        total = sum(cfg.physical_capacities) / (1 << 30)
        where += f"; oversubscribed: {total:.1f} GiB emulated on {host / (1 << 30):.1f} GiB of RAM"
    return f"accelreg-emu {_name().upper()} {index} ({where})"


def _versions() -> dict[str, str]:
    """The emulator's version, and the torch its extension is built against (no import of
    torch: its metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    out = {"accelreg-emu": __version__}
    try:
        out["torch (extension ABI)"] = version("torch")
    except PackageNotFoundError:  # pragma: no cover - the emulator needs torch to run at all
        pass
    return out


def _dtypes(index: int) -> dict[str, object]:
    """What the emulated devices compute in, as a vendor's probe answers it from its runtime:
    every operator runs on the host's CPU kernels, so it is what those compute, tried on device
    ``index`` (a small computation in each dtype; the same answers under every name)."""
    import torch
    from accelreg.plugin import try_dtypes

    return try_dtypes(torch.device(_name(), index))


def _optional(**fields: object) -> dict[str, object]:
    """The fields this accelreg's BackendSpec has (an older accelreg lacks ``versions``,
    ``dtypes``, ...)."""
    known = {f.name for f in dataclasses.fields(BackendSpec)}
    return {k: v for k, v in fields.items() if k in known}


def _name() -> str:
    try:
        return read_config().name or "emu"
    except EmuConfigError:
        return "emu"


@hookimpl
def accelreg_backends() -> Iterator[BackendSpec]:
    """The emulated backend, under the name ``ACCELREG_EMU_NAME`` gives it (``emu`` when off)."""
    name = _name()
    yield BackendSpec(
        name=name,
        priority=PRIORITIES[name],
        is_available=_is_available,
        device_count=_device_count,
        visible_devices_var=VISIBLE_VARS[name],
        current_index=_current_index,
        memory_info=_memory_info,
        device=_hpu_device if name == "hpu" else None,
        indexed=name != "hpu",
        description=f"emulated {name} on the host (accelreg-emu)",
        dist_backend=COLLECTIVES[name],
        # Emulation asked for (ACCELREG_EMU_NAME set) makes the backend *present*: a refused
        # configuration then warns (raises under a launcher) instead of giving cpu silently.
        runtime_package="accelreg_emu" if os.environ.get("ACCELREG_EMU_NAME") else None,
        # Slurm: a GRES type named for the emulated name, or Slurm's own gpu type.
        **_optional(versions=_versions, device_name=_device_name, gres=(name, "gpu"), dtypes=_dtypes),
    )
