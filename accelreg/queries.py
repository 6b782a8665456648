"""The public questions about backends: which exist, which is current, how many devices, which
collective backend, what a device computes in, which plugins failed.

Each answer comes from the registry's current snapshot under the same rule as ``resolve()``: a
backend that is present here but failing is never passed over silently (see
:func:`accelreg.resolution.current_in_use`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import registry
from .errors import DeviceError
from .registry.capabilities import capabilities as device_capabilities
from .resolution import check_fallback, current_in_use, resolve_in
from .types import BackendInfo, Capabilities, PluginFailure

if TYPE_CHECKING:
    from .registry import Backend, Snapshot

__all__ = ["backends", "capabilities", "current_backend", "device_count", "dist_backend", "failures"]


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


def capabilities(spec: Any = None, *, backend: str | None = None) -> Capabilities:
    """What the device ``spec`` means computes in: bfloat16, float16, float8_e4m3fn and
    float8_e5m2 (what that means: :mod:`accelreg.dtypes`), and whatever else its plugin declares.

    ``spec`` and ``backend`` are read exactly as :func:`accelreg.resolve` reads them, with the
    same errors (``None``: this process's device; ``"npu:1"``; ``0``; a ``torch.device``).
    ``capabilities().supports(torch.bfloat16)`` is ``True``, ``False``, or ``None`` when nobody
    knows: the backend's plugin does not say (``BackendSpec.dtypes``) and neither does its
    runtime (``torch.<device_type>.is_bf16_supported()``, ``.get_amp_supported_dtype()``). Each
    answer carries its source and reason (:class:`~accelreg.types.DtypeSupport`). Answers are
    probed on first use and kept until the registry is rebuilt; a probe that fails is recorded
    (:func:`failures`) and makes that device's answers unknown, never ``False``. The meta
    device computes nothing: :class:`DeviceError`.
    """
    snap = registry.get()
    device = resolve_in(snap, spec, backend)
    b = _owner(snap, spec, backend, device.type)
    if device.index is not None:
        index = device.index
    else:
        index = b.current_index() if b.spec.indexed else 0
    return device_capabilities(b, index, str(device))


def _owner(snap: Snapshot, spec: Any, backend: str | None, device_type: str) -> Backend:
    """The backend whose device ``resolve_in`` answered for ``spec`` (as it chose it)."""
    if backend is not None:
        return snap.backend(backend)
    if device_type == "meta":
        raise DeviceError("the meta device holds no data and computes nothing: ask about a backend's device")
    if device_type == "cpu":
        return snap.backend("cpu")
    if spec is None or spec == "auto" or (isinstance(spec, int) and not isinstance(spec, bool)):
        return snap.current()  # resolve() answered with the current backend
    name = spec.partition(":")[0] if isinstance(spec, str) else device_type
    # resolve()'s own lookup of a named device: a backend of that name, else of that device type
    return snap.by_name.get(name) or next(b for b in snap.order if b.device_type == name)


def failures() -> list[PluginFailure]:
    """Plugins that failed to load or answer so far (``accelreg env`` shows them too)."""
    return list(registry.get().failures)
