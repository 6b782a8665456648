"""Built-in backend: Intel Gaudi HPU (habana_frameworks.torch).

HPU devices are addressed without an index: each process sees its module(s) as ``"hpu"``.
"""

from __future__ import annotations

from ..plugin import HardwareSignature, hookimpl
from ._torchmod import torch_module_backend


def _device(index: int):
    import torch

    return torch.device("hpu")


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
        description="Intel Gaudi HPU (habana_frameworks.torch)",
    )
