"""Built-in backend: Apple Metal (``torch.mps``), a single device without a mask variable."""

from __future__ import annotations

import platform

from ..plugin import Availability, BackendSpec, MemoryInfo, hookimpl


def _available() -> Availability:
    import torch

    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return Availability.no(f"torch {torch.__version__} was built without MPS")
    if not mps.is_available():
        return Availability.no("torch.backends.mps reports no device")
    return Availability.yes("1 device via torch.mps")


def _memory(index: int) -> MemoryInfo | None:
    import torch

    total = int(torch.mps.recommended_max_memory())
    return MemoryInfo(free=max(total - int(torch.mps.driver_allocated_memory()), 0), total=total)


def _versions() -> dict[str, str]:
    """macOS's version (Metal ships with it)."""
    release = platform.mac_ver()[0]
    return {"macOS": release} if release else {}


def _dtypes(index: int) -> dict[str, object]:
    """What the Apple GPU computes in: float16 always, bfloat16 from macOS 14 (Metal's answer,
    ``torch.backends.mps.is_macos_or_newer(14, 0)``); float8 is not answered."""
    import torch

    bf16 = bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return {
        "float16": (True, "Metal computes in float16 on every Apple GPU"),
        "bfloat16": (bf16, f"Metal computes in bfloat16 from macOS 14: macOS 14 or newer is {bf16}"),
    }


@hookimpl
def accelreg_backends():
    yield BackendSpec(
        name="mps",
        priority=30,
        is_available=_available,
        device_count=lambda: 1,
        current_index=lambda: 0,
        memory_info=_memory,
        versions=_versions,
        device_name=lambda index: "Apple GPU (Metal)",
        description="Apple Metal (torch.mps)",
        dist_backend="gloo",  # torch's own default for mps tensors
        gres=(),  # no cluster scheduler hands out Apple GPUs
        dtypes=_dtypes,
    )
