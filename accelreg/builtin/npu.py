"""Built-in backend: Huawei Ascend NPU (torch_npu)."""

from __future__ import annotations

from ..plugin import hookimpl
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
        vllm_platform="ascend",  # vllm-ascend's platform plugin (entry point ascend = vllm_ascend:register)
        description="Huawei Ascend NPU (torch_npu)",
    )
