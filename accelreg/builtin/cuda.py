"""Built-in backend: NVIDIA CUDA (and AMD ROCm, which torch exposes as ``torch.cuda``)."""

from __future__ import annotations

import os
from functools import partial

from ..plugin import HardwareSignature, hookimpl, parse_visible_devices_truncating
from ._torchmod import read_first_line, torch_module_backend

VAR = "CUDA_VISIBLE_DEVICES"
#: Files a loaded GPU kernel driver creates (Linux): NVIDIA's, and ROCm's (torch.cuda on AMD).
DRIVER_FILES = (
    ("/proc/driver/nvidia/version", "the NVIDIA kernel driver is loaded"),
    ("/dev/nvidiactl", "the NVIDIA kernel driver is loaded"),
    ("/dev/kfd", "the ROCm kernel driver is loaded"),
)

#: An NVIDIA GPU on the PCI bus (VGA or 3D controller: not the audio function of its cards),
#: with or without a driver; an AMD GPU only once its ROCm driver is loaded (/dev/kfd), since
#: AMD's integrated graphics share the vendor id and class.
HARDWARE = HardwareSignature(
    what="GPU (NVIDIA, or AMD with its ROCm driver)",
    install="the GPU's driver and a CUDA (NVIDIA) or ROCm (AMD) build of torch: https://pytorch.org/get-started/locally/",
    device_nodes=("/dev/nvidia[0-9]*", "/dev/kfd"),
    pci_vendors=("0x10de",),
    pci_classes=("0x0300", "0x0302"),
)


def _not_compiled(module) -> str | None:
    import torch

    if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} was built without CUDA"
    if not module.is_available():
        mask = os.environ.get(VAR)
        suffix = f" ({VAR}={mask!r})" if mask is not None else ""
        return f"torch.cuda reports no devices{suffix}"
    return None


def _driver_loaded() -> str | None:
    """Why this machine has a GPU driver although torch.cuda is unusable (a CPU build of torch,
    a driver/runtime mismatch), so that falling back to cpu is never silent; ``None`` without."""
    for path, what in DRIVER_FILES:
        if os.path.exists(path):
            return f"{what} ({path})"
    return None


def _versions() -> dict[str, str]:
    """What torch was built with (CUDA or HIP, cuDNN) and the kernel driver's version, read
    from the driver's own files (no subprocess, no NVML)."""
    import torch

    out: dict[str, str] = {}
    if getattr(torch.version, "cuda", None):
        out["CUDA (torch build)"] = str(torch.version.cuda)
    if getattr(torch.version, "hip", None):
        out["HIP (torch build)"] = str(torch.version.hip)
    cudnn = torch.backends.cudnn
    if cudnn.is_available() and cudnn.version():
        out["cuDNN"] = str(cudnn.version())
    nvidia = read_first_line(
        "/proc/driver/nvidia/version"
    )  # "NVRM version: ... Kernel Module  550.54.15  ..."
    if nvidia is not None:
        words = nvidia.split()
        found = next((w for w in words if w[:1].isdigit() and "." in w), None)
        out["NVIDIA driver"] = found or nvidia[:200]
    amd = read_first_line("/sys/module/amdgpu/version")
    if amd is not None:
        out["amdgpu driver"] = amd[:200]
    return out


#: The first compute capability whose tensor cores multiply float8 (Ada, then Hopper):
#: ``torch._scaled_mm`` refuses older NVIDIA devices.
FP8_CAPABILITY = (8, 9)


def _dtypes(index: int) -> dict[str, object]:
    """What CUDA device ``index`` computes in, by torch's own rules for that device:
    ``torch.cuda.is_bf16_supported()`` (which asks only the current device) for bfloat16, float16
    everywhere, float8 from compute capability 8.9 (ROCm devices: not answered, gfx942 computes
    the fnuz float8 formats, later chips the OCP ones)."""
    import torch

    out: dict[str, object] = {
        "float16": (True, "every CUDA and ROCm device torch runs on computes in float16")
    }
    if getattr(torch.version, "hip", None):
        out["bfloat16"] = (True, "torch.cuda.is_bf16_supported(): every ROCm device computes in bfloat16")
        return out
    props = torch.cuda.get_device_properties(index)
    cc = (int(props.major), int(props.minor))
    where = f"compute capability {cc[0]}.{cc[1]}"
    if cc >= (8, 0):
        out["bfloat16"] = (True, f"{where} computes in bfloat16 natively (torch.cuda.is_bf16_supported())")
    else:
        try:  # torch.cuda.is_bf16_supported()'s own test for an older device: emulated
            torch.tensor([1.0], dtype=torch.bfloat16, device=torch.device("cuda", index))
            out["bfloat16"] = (True, f"{where} < 8.0: emulated, as torch.cuda.is_bf16_supported() counts it")
        except Exception as exc:  # noqa: BLE001 - torch's own test answers False on any failure
            out["bfloat16"] = (
                False,
                f"{where} < 8.0, and no bfloat16 tensor can be made: {type(exc).__name__}",
            )
    fp8 = cc >= FP8_CAPABILITY
    sign = ">=" if fp8 else "<"
    for name in ("float8_e4m3fn", "float8_e5m2"):
        out[name] = (fp8, f"{where} {sign} 8.9 (float8 matrix multiplies need Ada or Hopper)")
    return out


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "cuda",
        priority=100,
        package=None,
        visible_devices_var=VAR,
        parse_visible=partial(parse_visible_devices_truncating, var=VAR),
        not_compiled=_not_compiled,
        dist_backend="nccl",
        ray_resource="GPU",  # Ray's own name (Ray detects NVIDIA and AMD GPUs itself)
        gres=("gpu",),  # Slurm's own type (Slurm sets CUDA_VISIBLE_DEVICES itself)
        vllm_platform=("cuda", "rocm"),  # vLLM's own, whichever it finds (torch.cuda is ROCm on AMD)
        presence=_driver_loaded,
        runtime_versions=_versions,
        hardware=HARDWARE,
        dtypes=_dtypes,
        description="NVIDIA CUDA / AMD ROCm (torch.cuda)",
    )
