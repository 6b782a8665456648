"""accelreg: one registry for PyTorch accelerator backends.

Frameworks ask ``accelreg.resolve()`` instead of walking ``if is_npu_available(): ... elif``
ladders; backends (built in, or shipped by a vendor through the ``accelreg`` entry-point group)
declare availability, device counts, index->device mapping and placement rules; users set the
backend order in configuration.

``import accelreg`` is cheap: it loads no plugin and does not import torch or pluggy. The
registry is built on the first query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    AccelregError,
    ConfigError,
    DeviceError,
    DeviceMapError,
    IntegrationError,
    PlacementError,
    PluginConflictError,
    PluginError,
)
from .resolution import resolve

if TYPE_CHECKING:
    from .types import BackendInfo, PlacementRule, PluginFailure

__version__ = "0.1.0"

__all__ = [
    "AccelregError",
    "BackendInfo",
    "ConfigError",
    "DeviceError",
    "DeviceMapError",
    "IntegrationError",
    "PlacementError",
    "PlacementRule",
    "PluginConflictError",
    "PluginError",
    "backends",
    "check_device_map",
    "configure",
    "current_backend",
    "device_count",
    "device_map_for",
    "dist_backend",
    "failures",
    "hookimpl",
    "install",
    "placement_rule",
    "plan_device_map",
    "register",
    "reset",
    "resolve",
    "unregister",
    "visible_devices_env",
]


def backends() -> list[BackendInfo]:
    """Every registered backend in effective order (the order ``resolve()`` tries them)."""
    from . import registry

    return [b.info() for b in registry.get().order]


def current_backend() -> BackendInfo:
    """The first available backend by priority; ``cpu`` when no accelerator is available.

    Warns once (raises :class:`DeviceError` in strict mode) when that passes over a backend
    that is present here but failing, as :func:`resolve` does.
    """
    from . import registry
    from .resolution import check_fallback

    snap = registry.get()
    current = snap.current()
    check_fallback(snap, current, launcher_raises=False)
    return current.info()


def device_count(backend: str | None = None) -> int:
    """Devices of ``backend`` (default: the current backend) this process can address.

    An unavailable backend has 0; the cpu backend counts as one device; an unknown name raises
    :class:`DeviceError`.
    """
    from . import registry
    from .resolution import current_in_use

    snap = registry.get()
    if backend is None:
        return current_in_use(snap).count
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
    return snap.backend(backend).count


def dist_backend(backend: str | None = None) -> str:
    """The ``torch.distributed`` backend for collectives on ``backend``'s tensors (default: the
    current backend), as its plugin declares it: ``"nccl"``, ``"hccl"``, ``"gloo"``, ...

    Pass it to ``torch.distributed.init_process_group`` instead of a ``"nccl"`` ladder. An
    unknown name raises :class:`DeviceError`; so does a backend whose plugin declares no
    collective backend (the message says so: nothing is guessed).
    """
    from . import registry

    snap = registry.get()
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
    from .resolution import current_in_use

    chosen = current_in_use(snap) if backend is None else snap.backend(backend)
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
    from . import registry

    return list(registry.get().failures)


def configure(**settings: Any) -> None:
    """Set configuration explicitly; see :func:`accelreg.registry.configure`."""
    from . import registry

    registry.configure(**settings)


def reset() -> None:
    """Forget settings from :func:`configure`, registered plugins and every cached answer."""
    from . import registry

    registry.reset()


def register(plugin: Any, name: str | None = None) -> str:
    """Register a plugin object in-process; see :func:`accelreg.registry.register`."""
    from . import registry

    return registry.register(plugin, name)


def unregister(name: str) -> None:
    """Remove a plugin added with :func:`register`."""
    from . import registry

    registry.unregister(name)


def __getattr__(name: str) -> Any:
    # Lazy names: pluggy, the planner and the integrations load only when asked for.
    if name == "hookimpl":
        from .hookspecs import hookimpl

        return hookimpl
    if name in ("BackendInfo", "PlacementRule", "BackendSpec", "Availability", "MemoryInfo", "PluginFailure"):
        from . import types

        return getattr(types, name)
    if name in ("plan_device_map", "check_device_map"):
        from . import planner

        return getattr(planner, name)
    if name == "device_map_for":
        from .meta import device_map_for

        return device_map_for
    if name == "placement_rule":
        from .placement import placement_rule

        return placement_rule
    if name == "install":
        from .integrations import install

        return install
    if name == "visible_devices_env":
        from .launch import visible_devices_env

        return visible_devices_env
    raise AttributeError(f"module 'accelreg' has no attribute {name!r}")
