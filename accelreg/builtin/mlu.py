"""Built-in backend: Cambricon MLU (torch_mlu)."""

from __future__ import annotations

from ..plugin import hookimpl
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
        description="Cambricon MLU (torch_mlu)",
    )
