"""Built-in backend: Intel GPU (``torch.xpu``, part of torch since 2.4)."""

from __future__ import annotations

from functools import partial

from ..plugin import hookimpl, parse_visible_devices
from ._torchmod import torch_module_backend

VAR = "ZE_AFFINITY_MASK"


def _not_compiled(module) -> str | None:
    import torch

    compiled = getattr(module, "_is_compiled", None)
    if compiled is not None and not compiled():
        return f"torch {torch.__version__} was built without XPU support"
    return None


def _versions() -> dict[str, str]:
    """The SYCL runtime torch was built with and, with a device, its driver's and runtime's versions."""
    import torch

    out: dict[str, str] = {}
    if getattr(torch.version, "xpu", None):
        out["SYCL (torch build)"] = str(torch.version.xpu)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        props = xpu.get_device_properties(0)
        for key, attr in (("driver", "driver_version"), ("runtime", "version")):
            value = getattr(props, attr, None)
            if value:
                out[key] = str(value)
    return out


def _dtypes(index: int) -> dict[str, object]:
    """What XPU device ``index`` computes in: ``torch.xpu.is_bf16_supported()`` (it counts
    emulation, so it is true of every device) and the device's ``has_fp16``; float8 is not
    answered."""
    import torch

    props = torch.xpu.get_device_properties(index)
    bf16 = bool(torch.xpu.is_bf16_supported())
    fp16 = bool(getattr(props, "has_fp16", False))
    return {
        "bfloat16": (bf16, f"torch.xpu.is_bf16_supported() answered {bf16}"),
        "float16": (fp16, f"torch.xpu.get_device_properties({index}).has_fp16 is {fp16}"),
    }


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "xpu",
        priority=90,
        package=None,
        visible_devices_var=VAR,
        # Level Zero accepts "device" and "device.subdevice" entries.
        parse_visible=partial(parse_visible_devices, var=VAR, subdevices=True),
        not_compiled=_not_compiled,
        dist_backend="xccl",
        runtime_versions=_versions,
        ray_resource="GPU",  # Ray's own name (Ray's Intel GPU manager)
        gres=("gpu",),  # Slurm's own type (Slurm sets ZE_AFFINITY_MASK itself)
        vllm_platform="xpu",  # vLLM's own
        dtypes=_dtypes,
        description="Intel GPU (torch.xpu)",
    )
