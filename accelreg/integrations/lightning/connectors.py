"""The decisions Lightning's connectors make (Fabric's ``_Connector``, the Trainer's
``_AcceleratorConnector``) and its process-group backend, answered by the registry: the
accelerator for ``"auto"``, the strategy for a registry accelerator (the FSDP strategies
accepted on it), mixed precision on its device type, and its collective backend.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from ... import registry
from ...queries import dist_backend
from ...resolution import current_in_use
from .accelerator import RegistryAccelerator, fix_precision

_SCALER_WARNING = r".*GradScaler is enabled, but .* is not available.*"


def _registry_accelerator(connector: Any) -> RegistryAccelerator | None:
    accelerator = getattr(connector, "accelerator", None)
    return accelerator if isinstance(accelerator, RegistryAccelerator) else None


# -- the seams ------------------------------------------------------------------------------
def _choose_auto_accelerator(original: Any) -> Any:
    @functools.wraps(original)
    def _choose_auto_accelerator(*args: Any) -> str:
        lightnings = original(*args)
        snap = registry.get()
        current = current_in_use(snap)  # raises under a launcher past a present, failing backend
        if current.name != "cpu" or lightnings == "cpu":
            return current.name
        # The registry found no accelerator, Lightning's own ladder did: keep Lightning's pick
        # (hardware the registry has no backend for, like XLA, or sees as unavailable) unless
        # the user disabled that backend in accelreg's configuration.
        mine = snap.by_name.get(lightnings)
        return "cpu" if mine is not None and mine.blocked is not None else lightnings

    return _choose_auto_accelerator


def _choose_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def _choose_strategy(self: Any) -> Any:
        accelerator = _registry_accelerator(self)
        if accelerator is None:
            return original(self)
        names = original.__globals__
        if self._num_nodes_flag > 1:
            return "ddp"
        devices = list(self._parallel_devices or ())
        if len(devices) <= 1:
            device = devices[0] if devices else accelerator.device(0)
            return names["SingleDeviceStrategy"](device=device)
        return "ddp_fork" if names.get("_IS_INTERACTIVE") else "ddp"

    return _choose_strategy


def _check_strategy_and_fallback(original: Any) -> Any:
    @functools.wraps(original)
    def _check_strategy_and_fallback(self: Any) -> None:
        if _registry_accelerator(self) is None:
            return original(self)
        # Lightning lets its FSDP strategies run only on an accelerator named "cuda"/"gpu" (or its
        # CUDAAccelerator); torch's FSDP runs on any device with collectives, as the registry's
        # backends have (accelreg.dist_backend). The flag is read here for that check only, and
        # for "tpu" (fsdp -> xla_fsdp) and "cpu" (dp -> ddp), neither of which a registry
        # accelerator is: the rest of Lightning's checks run as they are, on a flag that names
        # a GPU for the time of the call.
        flag = self._accelerator_flag
        self._accelerator_flag = "gpu"
        try:
            return original(self)
        finally:
            self._accelerator_flag = flag

    return _check_strategy_and_fallback


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def _check_and_init_precision(self: Any) -> Any:
        accelerator = _registry_accelerator(self)
        if accelerator is None:
            return original(self)
        with warnings.catch_warnings():
            # Lightning builds its 16-bit scaler for the device type it assumed; it is replaced
            warnings.filterwarnings("ignore", message=_SCALER_WARNING)
            plugin = original(self)
        return fix_precision(plugin, accelerator.device_type)

    return _check_and_init_precision


def _process_group_backend(original: Any) -> Any:
    @functools.wraps(original)
    def _get_default_process_group_backend_for_device(device: Any) -> str:
        if device.type == "cpu":
            return original(device)
        snap = registry.get()
        current = snap.current()
        owner = current if current.device_type == device.type else None
        owner = owner or next((b for b in snap.order if b.device_type == device.type and b.available), None)
        if owner is None:
            return original(device)
        return dist_backend(owner.name)

    return _get_default_process_group_backend_for_device
