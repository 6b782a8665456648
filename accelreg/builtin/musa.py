"""Built-in backend: Moore Threads MUSA (torch_musa)."""

from __future__ import annotations

from ..plugin import HardwareSignature, hookimpl
from ._torchmod import torch_module_backend


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "musa",
        priority=60,
        package="torch_musa",
        visible_devices_var="MUSA_VISIBLE_DEVICES",
        dist_backend="mccl",
        gres=("musa", "gpu"),  # its own GRES type, or Slurm's gpu type on sites that use it
        hardware=HardwareSignature(
            what="Moore Threads GPU",
            install="torch_musa (Moore Threads' PyTorch extension) with its MUSA toolkit",
            pci_vendors=("0x1ed5",),  # Moore Threads; display controllers and accelerators
            pci_classes=("0x03", "0x12"),  # (not the audio function of its cards)
        ),
        description="Moore Threads MUSA (torch_musa)",
    )
