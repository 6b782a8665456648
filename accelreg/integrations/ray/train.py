"""Ray Train: a worker given a registry backend's units trains on the registry's device, over
the backend's collectives.

Ray Train decides a worker's torch device from the accelerator ids Ray gave it, with a device
manager per resource it knows (``GPU``, ``NPU``, ``HPU``, ``TPU``; anything else is the cpu), and
its process-group backend from the requested resources (``nccl`` for GPU, ``tpu_dist`` for TPU,
``gloo`` otherwise). With this integration, for a resource offered by accelreg's manager
(:mod:`accelreg.integrations.ray`):

- **the device**: ``ray.train.torch.get_device()`` is ``accelreg.resolve()`` of the worker — device
  0 of its own ids (Seam: ``ray.air._internal.device_manager.get_torch_device_manager_by_context``,
  imported by name into ``ray.air._internal.torch_utils`` and ``ray.train.torch.train_loop_utils``);
  ``prepare_model`` moves the model there and ``prepare_data_loader`` the batches.
- **the collectives**: when ``TorchConfig(backend=None)`` (the default) and the workers request a
  resource a registry backend is offered as, the process group uses that backend's
  :func:`accelreg.dist_backend` — also for Ray's own ``NPU`` (``hccl`` instead of ``gloo``) and
  ``GPU`` (``xccl`` on an Intel GPU node instead of ``nccl``); a backend whose plugin declares
  none is an error, not gloo on device tensors. Each worker brings its runtime up first, so a
  vendor's collectives are registered before ``init_process_group`` (Seam:
  ``ray.train.torch.config._TorchBackend.on_start``, run by the Train controller). A
  ``TorchConfig(backend=...)`` the user set is left alone.

Its own integration (trigger ``ray.train.torch``) because these modules import torch: a process
that imports ray only to run tasks does not pay for them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from typing import Any

from ... import queries, registry
from ...registry import Backend
from ...resolution import resolve
from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam
from . import managers as ray_core

__all__ = ["INTEGRATION", "collective_backend", "disable", "enable", "enabled", "registry_device_manager"]

_DEVICE_MANAGER = "ray.air._internal.device_manager"
_CONFIG = "ray.train.torch.config"
_TRAINER = "ray.train.v2.torch.torch_trainer"

_lock = threading.Lock()
#: Per process: ``manager`` (the registry's device manager once chosen), ``cls`` (its class).
_state: dict[str, Any] = {}


# -- the device ----------------------------------------------------------------------------
def _manager_class() -> type:
    """The registry's device manager (Ray's ``TorchDeviceManager`` interface), built once."""
    cls = _state.get("cls")
    if cls is not None:
        return cls
    import torch
    from ray.air._internal.device_manager.torch_device_manager import TorchDeviceManager

    class RegistryTorchDeviceManager(TorchDeviceManager):
        """A Ray Train worker's devices, from the registry: ``accelreg.resolve()`` first."""

        def __init__(self, backend: str) -> None:
            self.backend = backend

        def _module(self) -> Any:
            return torch.get_device_module(registry.get().backend(self.backend).device_type)

        def is_available(self) -> bool:
            return registry.get().backend(self.backend).available

        def get_devices(self) -> list[Any]:
            first = resolve(backend=self.backend)  # device 0 of the worker's own ids
            b = registry.get().backend(self.backend)
            if not b.spec.indexed:
                return [first]
            return [first] + [b.device(i) for i in range(b.count) if i != first.index]

        def set_device(self, device: Any) -> None:
            self._module().set_device(device)

        def supports_stream(self) -> bool:
            return hasattr(self._module(), "Stream")

        def create_stream(self, device: Any) -> Any:
            return self._module().Stream(device)

        def get_stream_context(self, stream: Any) -> Any:
            module = self._module()
            return module.stream(stream) if hasattr(module, "stream") else contextlib.nullcontext()

        def get_current_stream(self) -> Any:
            return self._module().current_stream()

    _state["cls"] = RegistryTorchDeviceManager
    return RegistryTorchDeviceManager


def registry_device_manager(backend: str) -> Any:
    """Ray Train's device manager for a worker on ``backend``'s devices, answering from the
    registry (what ``get_device()``/``prepare_model`` use in a worker given that backend's
    units). Imports torch and Ray Train."""
    return _manager_class()(backend)


def _get_torch_device_manager_by_context(original: Any) -> Any:
    @functools.wraps(original)
    def get_torch_device_manager_by_context() -> Any:
        with _lock:
            manager = _state.get("manager")
            if manager is not None:
                return manager
            import ray

            for resource, ids in ray.get_runtime_context().get_accelerator_ids().items():
                backend = ray_core.manager_for(resource) if ids else None
                if backend is not None:
                    manager = _state["manager"] = registry_device_manager(backend)
                    return manager
        return original()

    return get_torch_device_manager_by_context


# -- the collectives -----------------------------------------------------------------------
def collective_backend(resources_per_worker: dict[str, float]) -> tuple[str, str] | None:
    """``(registry backend, torch.distributed backend)`` for Train workers that request
    ``resources_per_worker``: the backend offered as the first requested accelerator resource
    the registry knows (the one available in this process, else the only one, else the one
    whose runtime is installed), and its :func:`accelreg.dist_backend`; ``None`` when no
    requested resource is a registry backend's. Raises :class:`~accelreg.errors.DeviceError`
    when the backend's plugin declares no collective backend."""
    groups = ray_core.resources()
    snap = registry.get()
    for resource, amount in resources_per_worker.items():
        if not amount or resource not in groups:
            continue
        backends = [snap.backend(n) for n in groups[resource]]
        chosen: Backend | None = next((b for b in backends if b.available), None)
        if chosen is None and len(backends) == 1:
            chosen = backends[0]
        if chosen is None:
            chosen = next((b for b in backends if ray_core._installed(b.spec)), None)
        if chosen is not None:
            return chosen.name, queries.dist_backend(chosen.name)
    return None


def _bring_up(backend: str) -> bool:
    """Run in each Train worker before its process group: probe ``backend``, which starts its
    runtime (a vendor's collectives are registered by it) in that process."""
    return registry.get().backend(backend).available


def _on_start(original: Any) -> Any:
    @functools.wraps(original)
    def on_start(self: Any, worker_group: Any, backend_config: Any) -> Any:
        chosen = collective_backend(dict(worker_group.get_resources_per_worker() or {}))
        if chosen is not None:
            backend, collectives = chosen
            asked = getattr(backend_config, "backend", "")
            if asked is None:  # Train 1's default: Ray's choice would be gloo
                backend_config = copy.copy(backend_config)
                backend_config.backend = asked = collectives
            if asked == collectives:
                worker_group.execute(_bring_up, backend)
        return original(self, worker_group, backend_config)

    return on_start


def _trainer_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(
        self: Any, *args: Any, torch_config: Any = None, scaling_config: Any = None, **kwargs: Any
    ) -> Any:
        if (torch_config is None or not torch_config.backend) and scaling_config is not None:
            chosen = collective_backend(dict(getattr(scaling_config, "resources_per_worker", None) or {}))
            if chosen is not None:
                from ray.train.torch.config import TorchConfig

                torch_config = copy.copy(torch_config) if torch_config is not None else TorchConfig()
                torch_config.backend = chosen[1]
        return original(self, *args, torch_config=torch_config, scaling_config=scaling_config, **kwargs)

    return __init__


def _on_disable() -> None:
    with _lock:
        _state.pop("manager", None)


RELEASES = table.row("ray_train").releases

INTEGRATION = Integration(
    **table.row("ray_train").declared(),
    seams=[
        Seam(
            _DEVICE_MANAGER,
            "get_torch_device_manager_by_context",
            importers=("ray.air._internal.torch_utils", "ray.train.torch.train_loop_utils"),
            why="a Train worker given a registry backend's units trains on accelreg.resolve()",
            adapters=(Adapter(RELEASES, _get_torch_device_manager_by_context, shapes=("1d62aad49afd1976",)),),
            instead="move the model to accelreg.resolve() yourself (prepare_model(model, move_to_device=accelreg.resolve()))",
        ),
        Seam(
            _TRAINER,
            "TorchTrainer.__init__",
            why="Train 2's TorchTrainer picks the registry backend's collectives (it fixes gloo before any seam sees it)",
            adapters=(
                Adapter(
                    RELEASES,
                    _trainer_init,
                    params=("self", "train_loop_per_worker", "torch_config", "scaling_config"),
                ),
            ),
            instead="pass TorchConfig(backend=accelreg.dist_backend()) to the TorchTrainer",
        ),
        Seam(
            _CONFIG,
            "_TorchBackend.on_start",
            why="the process group uses the registry backend's collectives (not gloo)",
            adapters=(Adapter(RELEASES, _on_start, params=("self", "worker_group", "backend_config")),),
            instead="pass TorchConfig(backend=accelreg.dist_backend()) to the TorchTrainer",
        ),
    ],
    scan_prefixes=("ray",),
    on_disable=_on_disable,
)

enable, disable, enabled = INTEGRATION.api()
