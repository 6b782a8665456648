"""The emulator's settings, read from environment variables (never imports torch).

``ACCELREG_EMU_NAME``     backend name: ``emu``, ``npu``, ``mlu``, ``musa``, ``sdaa`` or ``hpu``;
                          unset or empty means the emulator is off.
``ACCELREG_EMU_DEVICES``  number of physical emulated devices (default 2).
``ACCELREG_EMU_MEMORY``   capacity: one size for every device (``2GiB``, ``512MiB``, ``1.5GB``,
                          plain bytes) or a comma list, one per physical device. Unset: an
                          equal share of the host's RAM, one share left to the host
                          (:func:`default_capacity`), so default plans fit the machine.
``<visible variable>``    masks physical devices: ``ACCELREG_EMU_VISIBLE_DEVICES`` under
                          ``emu``, the vendor's variable under a vendor name.
``ACCELREG_EMU_SHALLOW_COPY``  ``0``: register no ``_has_compatible_shallow_copy_type``
                          override (``module.to(device)`` then makes new Parameters, as on a
                          PrivateUse1 runtime without one); default ``1``, as torch_npu does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "COLLECTIVES",
    "DEFAULT_CAPACITY",
    "DEFAULT_DEVICES",
    "NAMES",
    "PRIORITIES",
    "VISIBLE_VARS",
    "EmuConfig",
    "EmuConfigError",
    "default_capacity",
    "host_memory",
    "parse_size",
    "read_config",
]

NAMES = ("emu", "npu", "mlu", "musa", "sdaa", "hpu")

#: Environment variable that masks devices, per backend name.
VISIBLE_VARS: dict[str, str] = {
    "emu": "ACCELREG_EMU_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "mlu": "MLU_VISIBLE_DEVICES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
}

#: Default accelreg priority, per backend name (a vendor name takes that vendor's default).
PRIORITIES: dict[str, int] = {"emu": 5, "npu": 80, "mlu": 70, "musa": 60, "sdaa": 50, "hpu": 40}

#: ``torch.distributed`` backend name of the collectives, per backend name: the emulated
#: runtime's own (torch_npu and Habana register ``hccl``, torch_mlu ``cncl``, ...).
COLLECTIVES: dict[str, str] = {
    "emu": "emuccl",
    "npu": "hccl",
    "mlu": "cncl",
    "musa": "mccl",
    "sdaa": "tccl",
    "hpu": "hccl",
}

DEFAULT_DEVICES = 2
#: The most a device gets by default (and what each gets where the host's RAM is unknown).
DEFAULT_CAPACITY = 64 << 30
MAX_DEVICES = 64
_MIB = 1 << 20


def host_memory() -> int | None:
    """The host's physical RAM in bytes (``sysconf``: nothing imported), or ``None`` if unknown."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def default_capacity(devices: int, host: int | None = None) -> int:
    """Each device's capacity when ``ACCELREG_EMU_MEMORY`` is unset: an equal share of the
    host's RAM ``host`` (default: :func:`host_memory`) with one share left to the host itself
    (two devices on 24 GiB: 8 GiB each), in whole MiB, at most :data:`DEFAULT_CAPACITY` (which
    is also the answer where the RAM is unknown). Emulated memory is the host's: a default that
    promised more would make default plans budget memory the machine does not have."""
    if host is None:
        host = host_memory()
    if not host:
        return DEFAULT_CAPACITY
    share = host // (max(devices, 0) + 1) // _MIB * _MIB
    return max(min(share, DEFAULT_CAPACITY), _MIB)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


class EmuConfigError(ValueError):
    """An emulator environment variable has a value the emulator cannot use."""


def parse_size(text: str) -> int:
    """Bytes in ``"2GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"4096"`` (decimal and binary units)."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise EmuConfigError(
            f"ACCELREG_EMU_MEMORY: {text!r} is not a size (examples: 2GiB, 512MiB, 1.5GB, 1048576)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class EmuConfig:
    """What the emulator presents in this process.

    Attributes:
        name: Backend (and torch device type) name, or ``None`` when emulation is off.
        physical_devices: Devices the emulated machine has.
        physical_capacities: Capacity in bytes of each physical device.
        visible_devices_var: The variable that masks devices under this name.
        visible: Physical ids behind logical indices 0..n-1.
        shallow_copy: Whether host and device tensors are shallow-copy compatible, so that
            ``module.to(device)`` keeps its Parameter objects (``ACCELREG_EMU_SHALLOW_COPY``).
    """

    name: str | None
    physical_devices: int
    physical_capacities: tuple[int, ...]
    visible_devices_var: str | None
    visible: tuple[int, ...]
    shallow_copy: bool = True

    @property
    def enabled(self) -> bool:
        return self.name is not None

    @property
    def device_count(self) -> int:
        """Logical devices this process can address (after the visible-devices mask)."""
        return len(self.visible)

    @property
    def capacities(self) -> tuple[int, ...]:
        """Capacity in bytes of each logical device."""
        return tuple(self.physical_capacities[i] for i in self.visible)

    def oversubscribed(self, host: int | None = None) -> bool:
        """Whether the emulated devices promise more memory than the host has (only when
        ``ACCELREG_EMU_MEMORY`` asks for it): allocations past the host's RAM then fail or swap
        where a real device would have had room."""
        if host is None:
            host = host_memory()
        return bool(host) and sum(self.physical_capacities) > host  # type: ignore[operator]

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "enabled": self.enabled,
            "devices": self.device_count,
            "capacities": list(self.capacities),
            "oversubscribed": self.oversubscribed(),
            "physical_devices": self.physical_devices,
            "visible": list(self.visible),
            "visible_devices_var": self.visible_devices_var,
            "shallow_copy": self.shallow_copy,
        }


def _parse_visible(var: str, value: str, physical: int) -> tuple[int, ...]:
    text = value.strip()
    if text.lower() in ("", "none", "void", "nodevfiles"):
        return ()
    out: list[int] = []
    for raw in text.split(","):
        token = raw.strip()
        if not token.isdigit():
            raise EmuConfigError(f"{var}={value!r}: {token!r} is not a device id")
        index = int(token)
        if index >= physical:
            raise EmuConfigError(
                f"{var}={value!r}: device {index} does not exist "
                f"(the emulator has {physical}: ACCELREG_EMU_DEVICES={physical})"
            )
        if index in out:
            raise EmuConfigError(f"{var}={value!r}: device {index} is listed twice")
        out.append(index)
    return tuple(out)


def read_config(environ: Mapping[str, str] | None = None) -> EmuConfig:
    """The emulator configuration from ``environ`` (default ``os.environ``).

    Raises :class:`EmuConfigError` for a bad value, naming the variable.
    """
    env = os.environ if environ is None else environ
    raw_name = env.get("ACCELREG_EMU_NAME", "").strip().lower()
    name: str | None = raw_name or None
    if name is not None and name not in NAMES:
        raise EmuConfigError(f"ACCELREG_EMU_NAME={raw_name!r}: expected one of {', '.join(NAMES)}")

    raw_devices = env.get("ACCELREG_EMU_DEVICES", "").strip()
    if raw_devices:
        if not raw_devices.isdigit() or not 0 <= int(raw_devices) <= MAX_DEVICES:
            raise EmuConfigError(
                f"ACCELREG_EMU_DEVICES={raw_devices!r}: expected an integer 0..{MAX_DEVICES}"
            )
        physical = int(raw_devices)
    else:
        physical = DEFAULT_DEVICES

    raw_memory = env.get("ACCELREG_EMU_MEMORY", "").strip()
    if not raw_memory:
        capacities = (default_capacity(physical),) * physical
    else:
        sizes = [parse_size(part) for part in raw_memory.split(",")]
        if len(sizes) == 1:
            capacities = (sizes[0],) * physical
        elif len(sizes) == physical:
            capacities = tuple(sizes)
        else:
            raise EmuConfigError(
                f"ACCELREG_EMU_MEMORY={raw_memory!r}: {len(sizes)} sizes for {physical} devices "
                "(give one size for all, or one per device)"
            )

    var = VISIBLE_VARS[name] if name is not None else None
    if var is not None and var in env:
        visible = _parse_visible(var, env[var], physical)
    else:
        visible = tuple(range(physical))

    raw_shallow = env.get("ACCELREG_EMU_SHALLOW_COPY", "").strip()
    if raw_shallow not in ("", "0", "1"):
        raise EmuConfigError(f"ACCELREG_EMU_SHALLOW_COPY={raw_shallow!r}: expected 0 or 1")
    return EmuConfig(name, physical, capacities, var, visible, shallow_copy=raw_shallow != "0")
