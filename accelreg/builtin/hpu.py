"""Built-in backend: Intel Gaudi HPU (habana_frameworks.torch).

HPU devices are addressed without an index: each process sees its module(s) as ``"hpu"``.
"""

from __future__ import annotations

from ..plugin import HardwareSignature, hookimpl
from ._torchmod import torch_module_backend


def _device(index: int):
    import torch

    return torch.device("hpu")


def _dtypes(index: int) -> dict[str, object]:
    """What the Gaudi generation the runtime reports computes in (Gaudi's own
    ``habana_frameworks.torch.utils.experimental._get_device_type()``, which transformers asks
    too): bfloat16 on every Gaudi; float16 and both float8 formats from Gaudi2 on."""
    from habana_frameworks.torch.utils.experimental import _get_device_type, synDeviceType

    kind = _get_device_type()
    first = kind == synDeviceType.synDeviceGaudi
    generation = getattr(kind, "name", str(kind)).removeprefix("synDevice") or str(kind)
    later = f"{generation} computes in it (Gaudi2 and later do)"
    earlier = f"{generation} does not (only Gaudi2 and later do)"
    out: dict[str, object] = {"bfloat16": (True, f"every Gaudi computes in bfloat16 ({generation})")}
    for name in ("float16", "float8_e4m3fn", "float8_e5m2"):
        out[name] = (not first, earlier if first else later)
    return out


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "hpu",
        priority=40,
        package="habana_frameworks.torch",
        visible_devices_var="HABANA_VISIBLE_MODULES",
        device=_device,
        indexed=False,
        dist_backend="hccl",
        ray_resource="HPU",  # Ray's own name
        gres=(),  # HABANA_VISIBLE_MODULES takes module ids, not Slurm's device indices
        hardware=HardwareSignature(
            what="Intel Gaudi (Habana) accelerator",
            install="the Intel Gaudi software stack (habana_frameworks.torch): https://docs.habana.ai",
            device_nodes=("/dev/hl[0-9]*",),  # the habanalabs kernel driver's
            pci_vendors=("0x1da3",),  # Habana Labs: every device is an accelerator
        ),
        vllm_platform="hpu",  # vllm-gaudi's platform plugin (entry point hpu = vllm_gaudi:register)
        dtypes=_dtypes,
        description="Intel Gaudi HPU (habana_frameworks.torch)",
    )
