"""The public questions about backends: which exist, which is current, how many devices, which
collective backend, which plugins failed.

Each answer comes from the registry's current snapshot under the same rule as ``resolve()``: a
backend that is present here but failing is never passed over silently (see
:func:`accelreg.resolution.current_in_use`).
"""

from __future__ import annotations

from . import registry
from .errors import DeviceError
from .resolution import check_fallback, current_in_use
from .types import BackendInfo, PluginFailure

__all__ = ["backends", "current_backend", "device_count", "dist_backend", "failures"]


def backends() -> list[BackendInfo]:
    """Every registered backend in effective order (the order ``resolve()`` tries them)."""
    return [b.info() for b in registry.get().order]


def current_backend() -> BackendInfo:
    """The first available backend by priority; ``cpu`` when no accelerator is available.

    Warns once (raises :class:`DeviceError` in strict mode) when that passes over a backend
    that is present here but failing, as :func:`resolve` does.
    """
    snap = registry.get()
    current = snap.current()
    check_fallback(snap, current, launcher_raises=False)
    return current.info()


def _backend_name(backend: object) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
    return backend


def device_count(backend: str | None = None) -> int:
    """Devices of ``backend`` (default: the current backend) this process can address.

    An unavailable backend has 0; the cpu backend counts as one device; an unknown name raises
    :class:`DeviceError`.
    """
    snap = registry.get()
    if backend is None:
        return current_in_use(snap).count
    return snap.backend(_backend_name(backend)).count


def dist_backend(backend: str | None = None) -> str:
    """The ``torch.distributed`` backend for collectives on ``backend``'s tensors (default: the
    current backend), as its plugin declares it: ``"nccl"``, ``"hccl"``, ``"gloo"``, ...

    Pass it to ``torch.distributed.init_process_group`` instead of a ``"nccl"`` ladder. An
    unknown name raises :class:`DeviceError`; so does a backend whose plugin declares no
    collective backend (the message says so: nothing is guessed).
    """
    snap = registry.get()
    chosen = current_in_use(snap) if backend is None else snap.backend(_backend_name(backend))
    name = chosen.spec.dist_backend
    if not name:
        who = chosen.plugin.distribution or chosen.plugin.name or "its plugin"
        raise DeviceError(
            f"{chosen.name} declares no collective backend (BackendSpec.dist_backend is unset by "
            f"{who}); pass the torch.distributed backend explicitly"
        )
    return name


def failures() -> list[PluginFailure]:
    """Plugins that failed to load or answer so far (``accelreg env`` shows them too)."""
    return list(registry.get().failures)
