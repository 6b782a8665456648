"""Built-in backend: Tecorigin SDAA (torch_sdaa)."""

from __future__ import annotations

from ..plugin import hookimpl
from ._torchmod import torch_module_backend


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "sdaa",
        priority=50,
        package="torch_sdaa",
        visible_devices_var="SDAA_VISIBLE_DEVICES",
        dist_backend="tccl",
        gres=("sdaa", "gpu"),  # its own GRES type, or Slurm's gpu type on sites that use it
        description="Tecorigin SDAA (torch_sdaa)",
    )
