"""vLLM's platform for a backend that has none of its own, built from the registry.

vLLM runs on exactly one *platform* per process (``vllm.platforms.current_platform``): its own
(CUDA, ROCm, XPU, TPU, CPU) or a vendor's plugin. A backend whose :class:`~accelreg.types.BackendSpec`
names no ``vllm_platform`` is served by the class made here, which answers every platform question
from the registry: the device type and how torch dispatches it, the device count, each device's
name and memory (:class:`~accelreg.types.MemoryInfo`), the visible-devices variable (vLLM's
*device-control* variable), and the collective backend (:func:`accelreg.dist_backend`). What
runs on the device is torch's own: the worker and model runner of :mod:`.vllm_worker`, the
paged attention of :mod:`.vllm_attention` written in torch operations, and vLLM's layers in their
``forward_native`` form (an out-of-tree platform gets ``forward_oot``, which is that). No vLLM
kernel (``vllm._C``) and no ``torch.compile`` run there: the model executes eagerly.

This module imports vLLM: only vLLM imports it (through the class path the integration hands
``vllm.platforms``), after the integration chose the registry platform for this process.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from ... import registry
from ...errors import DeviceError
from . import selection

__all__ = ["ATTENTION_BACKEND", "KERNELS", "WORKER", "RegistryPlatform", "compute_slot_mapping", "platform"]

#: The class paths vLLM imports for this platform's workers and attention.
WORKER = "accelreg.integrations.vllm.worker.RegistryWorker"
ATTENTION_BACKEND = "accelreg.integrations.vllm.attention.RegistryAttentionBackend"
_COMMUNICATOR = "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    slot_mapping_ptr: torch.Tensor,
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int = 1,
    TOTAL_CP_RANK: int = 0,
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
    PAD_ID: int = -1,
    BLOCK_SIZE: int = 1024,
) -> None:
    """vLLM's slot-mapping kernel (``vllm.v1.worker.block_table.ComputeSlotMappingKernel``, a
    Triton kernel) in torch operations, with its parameters: each scheduled token's cache slot,
    ``block_table[request, position // block_size] * block_size + position % block_size``, and
    ``PAD_ID`` in the unused slots up to ``max_num_tokens``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("accelreg's torch-native attention does not support context parallelism")
    starts = query_start_loc_ptr.to(torch.long)
    counts = starts[1:] - starts[:-1]
    requests = torch.repeat_interleave(torch.arange(counts.shape[0], device=starts.device), counts)
    n = requests.shape[0]
    positions = positions_ptr[:n].to(torch.long)
    blocks = block_table_ptr[requests, positions // KV_CACHE_BLOCK_SIZE].to(torch.long)
    slot_mapping_ptr[:n] = blocks * KV_CACHE_BLOCK_SIZE + positions % KV_CACHE_BLOCK_SIZE
    if max_num_tokens > n:
        slot_mapping_ptr[n:max_num_tokens] = PAD_ID


#: vLLM's Triton kernels the registry platform runs in torch operations instead, by the name
#: vLLM's kernel dispatcher (``vllm.triton_utils.dispatcher.register_kernels``) knows them by.
KERNELS = {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping}


def _dispatch_key(device_type: str) -> str:
    """The dispatch key of torch's operators for ``device_type``: ``PrivateUse1`` for an
    out-of-tree runtime, else the in-tree key (``XPU``, ``HPU``, ``MPS``, ...)."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    return device_type.upper()


class RegistryPlatform(Platform):
    """A vLLM platform for the registry backend :attr:`backend` (set on the subclass
    :func:`platform` makes). Every answer comes from the registry in this process."""

    _enum = PlatformEnum.OOT
    #: The registry backend this platform serves.
    backend: str = ""
    device_name: str = ""
    device_type: str = ""
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    device_control_env_var: str = "VLLM_DEVICE_CONTROL_ENV_VAR_PLACEHOLDER"
    # vLLM's own compiler passes and graph capture are for its kernels: this platform runs eagerly
    simple_compile_backend: str = "eager"

    @classmethod
    def _backend(cls) -> Any:
        return registry.get().backend(cls.backend)

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    # -- devices ------------------------------------------------------------------------------
    @classmethod
    def device_count(cls) -> int:
        """The devices this process can address (the registry's count, under its mask)."""
        return cls._backend().count

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls._backend().device_name(device_id) or f"{cls.device_type}:{device_id}"

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"{cls.backend}-{cls.device_id_to_physical_device_id(device_id)}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        memory = cls._backend().memory(device_id)
        if memory is None:
            raise DeviceError(f"{cls.backend} reports no memory figures (its plugin declares no memory_info)")
        return memory.total

    @classmethod
    def mem_get_info(cls, device_id: int = 0) -> tuple[int, int]:
        """``(free, total)`` bytes of one device, from the plugin's ``memory_info``."""
        memory = cls._backend().memory(device_id)
        if memory is None:
            raise DeviceError(f"{cls.backend} reports no memory figures (its plugin declares no memory_info)")
        return memory.free, memory.total

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        index = torch.device(device).index if device is not None else 0
        free, total = cls.mem_get_info(index or 0)
        return float(total - free)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        module = getattr(torch, cls.device_type, None)
        if module is not None and hasattr(module, "set_device") and device.index is not None:
            module.set_device(device.index)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        module = getattr(torch, cls.device_type, None)
        if module is not None and hasattr(module, "manual_seed_all"):
            module.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls) -> Any:
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        return None

    # -- what runs ----------------------------------------------------------------------------
    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = 16
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        vllm_config.scheduler_config.async_scheduling = False
        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        # a forked worker would inherit a runtime the parent already brought up
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    @classmethod
    def get_attn_backend_cls(
        cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if getattr(attn_selector_config, "use_mla", False) or getattr(
            attn_selector_config, "use_sparse", False
        ):
            raise NotImplementedError(
                f"accelreg's registry platform for {cls.backend} has torch-native paged attention only: "
                "multi-head latent (MLA) and sparse attention need a vLLM platform of the vendor's own"
            )
        return ATTENTION_BACKEND

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return _COMMUNICATOR

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"

    @classmethod
    def import_kernels(cls) -> None:
        """Nothing: the registry platform runs no vLLM kernel library."""

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """vLLM's Triton kernels that a generation needs, in torch operations (no Triton runs
        on the registry platform)."""
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels(KERNELS)

    @classmethod
    def import_ir_kernels(cls) -> None:
        import vllm.kernels  # noqa: F401 - vLLM's IR ops, whose native forms run here

    @classmethod
    def supports_structured_output(cls) -> bool:
        return True


def platform() -> RegistryPlatform:
    """The registry platform of the backend the integration chose in this process (what vLLM's
    ``current_platform`` becomes): a :class:`RegistryPlatform` subclass bound to it."""
    name = selection.chosen_backend()
    b = registry.get().backend(name)
    spec = b.spec
    attrs = {
        "__module__": __name__,
        "__doc__": f"vLLM's platform for accelreg's {name} backend, built from the registry.",
        "backend": name,
        "device_name": name,
        "device_type": b.device_type,
        "dispatch_key": _dispatch_key(b.device_type),
        "dist_backend": spec.dist_backend or "gloo",
        "device_control_env_var": spec.visible_devices_var or RegistryPlatform.device_control_env_var,
        "ray_device_key": spec.ray_resource_name if spec.visible_devices_var else "",
    }
    cls = type(f"Registry{name.title().replace('_', '')}Platform", (RegistryPlatform,), attrs)
    return cls()
