"""Built-in backend: Huawei Ascend NPU (torch_npu)."""

from __future__ import annotations

from ..plugin import HardwareSignature, hookimpl
from ._torchmod import torch_module_backend


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "npu",
        priority=80,
        package="torch_npu",
        visible_devices_var="ASCEND_RT_VISIBLE_DEVICES",
        dist_backend="hccl",
        ray_resource="NPU",  # Ray's own name (Ray's NPU manager counts /dev/davinci*)
        gres=("npu", "gpu"),  # its own GRES type, or Slurm's gpu type on sites that use it
        hardware=HardwareSignature(
            what="Huawei Ascend NPU",
            install="torch_npu (pip install torch-npu) with Ascend's CANN toolkit",
            device_nodes=("/dev/davinci[0-9]*",),  # one per NPU, from Ascend's kernel driver
            pci_vendors=("0x19e5",),  # Huawei; 0x12: processing accelerators (not its NICs)
            pci_classes=("0x12",),
        ),
        vllm_platform="ascend",  # vllm-ascend's platform plugin (entry point ascend = vllm_ascend:register)
        description="Huawei Ascend NPU (torch_npu)",
    )
