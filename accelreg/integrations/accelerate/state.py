"""accelerate's ``PartialState``: the default device, the process group's backend and each rank's
device come from the registry; a launched rank is never put on the cpu in silence.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from ... import registry
from ...errors import DeviceError
from ...resolution import current_in_use, resolve

if TYPE_CHECKING:
    from ...registry import Backend


def _default_device(original: Any) -> Any:
    def default_device(self: Any) -> Any:
        import torch

        current = current_in_use(registry.get())
        if current.name == "cpu":
            return torch.device("cpu")
        return torch.device(current.device_type)  # upstream's form: the type, no index

    return property(default_device, doc="The registry's current backend, in accelerate's form (accelreg).")


# -- the ranks: PartialState's distributed type, process group and device ----------------------
def _launched() -> bool:
    """A launcher started this rank (accelerate's own test: ``LOCAL_RANK`` set)."""
    return int(os.environ.get("LOCAL_RANK", -1)) != -1


def _distributed_type(kinds: Any, backend: Backend) -> Any:
    """accelerate's multi-process type (of its enum ``kinds``) for ``backend``: its own
    ``MULTI_<DEVICE TYPE>`` where accelerate has one (npu, mlu, xpu, ...), else ``MULTI_GPU``,
    accelerate's generic one-process-per-device type (its launch paths are torchrun's; accelreg
    seams its device)."""
    try:
        return kinds(f"MULTI_{backend.device_type.upper()}")
    except ValueError:
        return kinds.MULTI_GPU


def _prepare_backend(original: Any) -> Any:
    @functools.wraps(original)
    def _prepare_backend(
        self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None
    ) -> Any:
        theirs = original(self, cpu, sagemaker_dp, backend)
        if cpu or sagemaker_dp or not _launched():
            return theirs
        kinds = original.__globals__["DistributedType"]
        if theirs[1] == kinds.XLA:
            return theirs
        chosen = current_in_use(registry.get())  # a present but failing backend: DeviceError
        if chosen.name == "cpu":
            if theirs[1] == kinds.MULTI_CPU:
                return theirs
            # accelerate's own detection found a backend the registry would not choose (disabled,
            # masked away, failing), or (1.16) no accelerator and so no process group at all: a
            # launched rank runs as accelerate's cpu ranks do, in one group over gloo
            return original(self, True, sagemaker_dp, backend)
        ours = _distributed_type(kinds, chosen)
        if theirs[1] == ours:
            return theirs  # accelerate knows this backend: its own set-up (imports, names) stands
        from ...queries import dist_backend  # at first use, not in install()

        return (backend if backend is not None else dist_backend(chosen.name)), ours

    return _prepare_backend


def _set_device(original: Any) -> Any:
    @functools.wraps(original)
    def set_device(self: Any) -> None:
        if self.device is not None:
            return original(self)
        kinds = original.__globals__["DistributedType"]
        if self.distributed_type in (kinds.NO, kinds.MULTI_CPU, kinds.XLA) or getattr(self, "_cpu", False):
            original(self)
        else:
            snap = registry.get()
            chosen = current_in_use(snap)
            if chosen.name == "cpu":
                original(self)
            else:
                # the registry's device for this rank: <backend>:<LOCAL_RANK>, a DeviceError past
                # the backend's devices (accelerate wraps the rank around the device count)
                device = resolve()
                module = getattr(original.__globals__["torch"], device.type, None)
                if device.index is not None and callable(getattr(module, "set_device", None)):
                    module.set_device(device)
                self.device = device
        _never_silently_cpu(self, "accelerate.PartialState.set_device()")

    return set_device


def _asks_for_cpu() -> bool:
    """Whether ``ACCELERATE_USE_CPU`` asks for the cpu, read as accelerate reads it: with its own
    ``accelerate.utils.environment.parse_flag_from_env`` (in every served release, 1.10 to 1.16:
    y/yes/t/true/on/1, any case). A value accelerate refuses does not ask for the cpu."""
    from accelerate.utils.environment import parse_flag_from_env

    try:
        return bool(parse_flag_from_env("ACCELERATE_USE_CPU"))
    except ValueError:  # accelerate's "invalid truth value" (its own AcceleratorState raises it)
        return False


def _never_silently_cpu(state: Any, call: str) -> None:
    """A launcher-started rank that accelerate put on the cpu while the registry has an
    available accelerator, without the cpu being asked for (``cpu=True``, ``--cpu``,
    ``ACCELERATE_USE_CPU``): a :class:`DeviceError` naming the call, never a silent cpu job."""
    device = getattr(state, "device", None)
    if device is None or device.type != "cpu" or getattr(state, "_cpu", False):
        return
    if _asks_for_cpu():
        return
    snap = registry.get()
    if snap.launcher is None:
        return
    current = snap.current()
    if current.name == "cpu":
        return
    var, value = snap.launcher
    raise DeviceError(
        f"{call} put this process on the cpu (distributed type {state.distributed_type}), but the "
        f"registry's backend {current.name} is available here ({', '.join(current.info().devices())}) and "
        f"a launcher started this process ({var}={value}); accelreg will not run a job on the cpu silently. "
        "Ask for the cpu explicitly (accelerate launch --cpu, Accelerator(cpu=True)) or disable "
        f"{current.name} (ACCELREG_DISABLE={current.name})"
    )


# -- the barrier of a cpu rank: 1.11-1.15 ----------------------------------------------------------
def _wait_for_everyone(original: Any) -> Any:
    """accelerate 1.11-1.15 hand ``device_ids`` to ``torch.distributed.barrier`` for ``MULTI_CPU``
    ranks too, so torch runs the barrier on the machine's accelerator, which a gloo group has no
    backend for: a rank the registry put on the cpu while a device runtime is up (its backend
    disabled) failed there. A cpu rank's barrier is a plain one, as in 1.10 and 1.16."""

    @functools.wraps(original)
    def wait_for_everyone(self: Any) -> None:
        from accelerate.state import DistributedType

        if self.distributed_type == DistributedType.MULTI_CPU:
            import torch

            torch.distributed.barrier()
            return
        original(self)

    return wait_for_everyone
