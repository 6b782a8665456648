"""What the registry says a library's accelerator computes in: the answer every seam on a host
library's bf16/fp16 check gives (:func:`accelreg.capabilities`), or ``None`` to keep the
library's own answer.

``None`` is not ``False``: it means the question is not the registry's to answer here (no
accelerator, so a "bf16 on the GPU" check is not about the cpu backend; a device type no
registry backend has) or nobody knows (the plugin and its runtime do not say). A seam then
returns the library's own answer, never a ``False`` that would turn into the cpu.
"""

from __future__ import annotations

from typing import Any

from ... import registry
from ...errors import DeviceError
from ...resolution import current_in_use

__all__ = ["accelerator_supports", "registry_device_type"]


def registry_device_type(device: Any) -> str | None:
    """The device type of ``device`` (``"emu"``, ``"npu:1"``, a ``torch.device``) when a registry
    accelerator has that type, else ``None`` (the cpu, meta, a type no backend declares)."""
    kind = str(device).partition(":")[0].strip()
    if not kind or kind in ("cpu", "meta", "disk"):
        return None
    return kind if any(b.device_type == kind and b.name != "cpu" for b in registry.get().order) else None


def accelerator_supports(dtype: Any, device: Any = None) -> bool | None:
    """Whether the accelerator computes in ``dtype``, as :func:`accelreg.capabilities` answers.

    ``device=None``: the device of this process's current backend, and ``None`` when that is the
    cpu (no accelerator). A ``device`` (string or ``torch.device``): that device when its type is
    a registry accelerator's, else ``None``. Also ``None`` when the answer is unknown or the
    named ``device`` is not one the registry can address here (a :class:`~accelreg.DeviceError`).
    The current backend's device is asked as :func:`accelreg.resolve` asks it: a present but
    failing backend under a launcher raises, as every device decision does.
    """
    from ...queries import capabilities  # at first use, not in install()

    if device is None:
        if current_in_use(registry.get()).name == "cpu":
            return None
        return capabilities().supports(dtype)
    if registry_device_type(device) is None:
        return None
    try:
        return capabilities(str(device)).supports(dtype)
    except DeviceError:
        return None
