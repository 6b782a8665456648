"""vLLM's worker and model runner on the registry platform (:mod:`.vllm_platform`).

vLLM's GPU worker and model runner are written for CUDA (streams, graphs, its memory profiler);
its CPU worker and model runner drop exactly those, and then pin everything to the host (they
assert the ``cpu`` device and move every device buffer to host memory). The registry's are
the CPU ones without that pinning: the device is ``<device_type>:<local rank>`` of the
registry's backend, each rank's buffers, weights and KV cache live there, collectives run on
the backend's own ``torch.distributed`` backend, and the KV cache is sized from the plugin's
``memory_info`` (or ``kv_cache_memory_bytes``).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

from ...errors import DeviceError

__all__ = ["RegistryModelRunner", "RegistryWorker"]


def _other_device_modules(device: torch.device) -> list[Any]:
    """torch's per-device-type modules (``torch.<type>`` with ``Stream`` and ``Event``) of every
    type but ``device``'s: whichever one vLLM's GPU model runner was written for, it is not the
    registry device's (that one runs vLLM's own runner), and a device of that type on the same
    node is not the device this worker was given."""
    own = torch.get_device_module(device)
    found: list[Any] = []
    for name in dir(torch):
        module = getattr(torch, name, None)
        if (
            isinstance(module, types.ModuleType)
            and module is not own
            and module not in found
            and isinstance(getattr(module, "Stream", None), type)  # not torch.ops' made-up names
            and isinstance(getattr(module, "Event", None), type)
            and callable(getattr(module, "is_available", None))
        ):
            found.append(module)
    return found


@contextmanager
def _device_streams(device: torch.device) -> Iterator[None]:
    """Streams and events of the registry's ``device`` wherever vLLM's model runner asks another
    torch device module (it creates its streams and events through the module of the
    accelerator it was written for), while the runner is built."""
    modules = _other_device_modules(device)
    saved = [(module, module.Stream, module.Event) for module in modules]

    def stream(*args: Any, **kwargs: Any) -> torch.Stream:
        return torch.Stream(device=device)

    def event(*args: Any, enable_timing: bool = False, blocking: bool = False, **kwargs: Any) -> torch.Event:
        return torch.Event(device=device, enable_timing=enable_timing, blocking=blocking)

    for module in modules:
        module.Stream, module.Event = stream, event
    try:
        yield
    finally:
        for module, old_stream, old_event in saved:
            module.Stream, module.Event = old_stream, old_event


class RegistryModelRunner(CPUModelRunner):
    """vLLM's CPU model runner on a registry device: the model, its inputs and the KV cache
    live on ``device``."""

    def __init__(self, vllm_config: Any, device: torch.device) -> None:
        with _device_streams(device):
            GPUModelRunner.__init__(self, vllm_config, device)

    def _sync_device(self) -> None:
        torch.accelerator.synchronize()


class RegistryWorker(CPUWorker):
    """vLLM's worker for one device of the registry backend the platform serves."""

    def __init__(
        self,
        vllm_config: Any,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        # CPUWorker's own set-up binds host memory nodes; a device worker has none to bind
        Worker.__init__(self, vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.parallel_config.disable_custom_all_reduce = True

    def init_device(self) -> None:
        platform = current_platform
        count = platform.device_count()
        if self.local_rank >= count:
            var = platform.device_control_env_var
            raise DeviceError(
                f"vLLM worker {self.rank} wants {platform.device_type}:{self.local_rank}, but {platform.backend} "
                f"has {count} device(s) here (visible through {var}); lower tensor_parallel_size or show more devices"
            )
        self.device = torch.device(platform.device_type, self.local_rank)
        platform.set_device(self.device)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, platform.dist_backend
        )
        set_random_seed(self.model_config.seed)
        self.model_runner = RegistryModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager[Any]:
        """No sleep-mode memory pool: the device's own allocator holds everything."""
        return nullcontext()

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` when set, else the share
        ``gpu_memory_utilization`` of the device's total memory (from the plugin's
        ``memory_info``) less what the weights and a profiling step hold."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        index = self.device.index or 0
        self.model_runner.profile_run()
        free, total = current_platform.mem_get_info(index)
        share = self.cache_config.gpu_memory_utilization
        available = int(total * share) - (total - free)
        if available <= 0:
            raise DeviceError(
                f"{self.device}: {total - free} of {total} bytes are in use after loading the model, more than "
                f"gpu_memory_utilization={share} allows; raise it or set kv_cache_memory_bytes"
            )
        return available
