"""Built-in backend: Cambricon MLU (torch_mlu)."""

from __future__ import annotations

from ..plugin import HardwareSignature, hookimpl
from ._torchmod import torch_module_backend


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "mlu",
        priority=70,
        package="torch_mlu",
        visible_devices_var="MLU_VISIBLE_DEVICES",
        dist_backend="cncl",
        gres=("mlu", "gpu"),  # its own GRES type, or Slurm's gpu type on sites that use it
        hardware=HardwareSignature(
            what="Cambricon MLU",
            install="torch_mlu (Cambricon's PyTorch extension) with its Neuware SDK",
            device_nodes=("/dev/cambricon_dev[0-9]*",),  # the Cambricon kernel driver's
            pci_vendors=("0xcabc",),  # Cambricon
        ),
        description="Cambricon MLU (torch_mlu)",
    )
