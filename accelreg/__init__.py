"""accelreg: one registry for PyTorch accelerator backends.

Frameworks ask ``accelreg.resolve()`` instead of walking ``if is_npu_available(): ... elif``
ladders; backends (built in, or shipped by a vendor through the ``accelreg`` entry-point group)
declare availability, device counts, index->device mapping and placement rules; users set the
backend order in configuration.

``import accelreg`` is cheap: it imports the error types and nothing else — no plugin, no
torch, no pluggy, no registry. Every other public name is served from the module that owns it
the first time it is used (see :data:`_OWNERS`), and the registry is built on the first query.
"""

from __future__ import annotations

import importlib

from .errors import (
    AccelregError,
    ConfigError,
    DeviceError,
    DeviceMapError,
    IntegrationError,
    MetaModelError,
    PlacementError,
    PluginConflictError,
    PluginError,
    UsageError,
)

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:  # what the lazily served names are, for type checkers and readers
    from typing import Any

    from .hookspecs import hookimpl
    from .integrations import install
    from .launch import visible_devices_env
    from .meta import device_map_for
    from .placement import placement_rule
    from .planner import check_device_map, plan_device_map
    from .queries import backends, capabilities, current_backend, device_count, dist_backend, failures
    from .registry import configure, register, reset, unregister
    from .resolution import resolve
    from .types import (
        Availability,
        BackendInfo,
        BackendSpec,
        Capabilities,
        DtypeSupport,
        MemoryInfo,
        PlacementRule,
        PluginFailure,
    )

__version__ = "0.2.0"

#: Each lazily served public name, and the module that owns it.
_OWNERS: dict[str, str] = {
    "resolve": "accelreg.resolution",
    "backends": "accelreg.queries",
    "capabilities": "accelreg.queries",
    "current_backend": "accelreg.queries",
    "device_count": "accelreg.queries",
    "dist_backend": "accelreg.queries",
    "failures": "accelreg.queries",
    "configure": "accelreg.registry",
    "reset": "accelreg.registry",
    "register": "accelreg.registry",
    "unregister": "accelreg.registry",
    "hookimpl": "accelreg.hookspecs",
    "Availability": "accelreg.types",
    "BackendInfo": "accelreg.types",
    "BackendSpec": "accelreg.types",
    "Capabilities": "accelreg.types",
    "DtypeSupport": "accelreg.types",
    "MemoryInfo": "accelreg.types",
    "PlacementRule": "accelreg.types",
    "PluginFailure": "accelreg.types",
    "plan_device_map": "accelreg.planner",
    "check_device_map": "accelreg.planner",
    "device_map_for": "accelreg.meta",
    "placement_rule": "accelreg.placement",
    "install": "accelreg.integrations",
    "visible_devices_env": "accelreg.launch",
}

__all__ = [
    "AccelregError",
    "Availability",
    "BackendInfo",
    "BackendSpec",
    "Capabilities",
    "ConfigError",
    "DeviceError",
    "DeviceMapError",
    "DtypeSupport",
    "IntegrationError",
    "MemoryInfo",
    "MetaModelError",
    "PlacementError",
    "PlacementRule",
    "PluginConflictError",
    "PluginError",
    "PluginFailure",
    "UsageError",
    "backends",
    "capabilities",
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


def __getattr__(name: str) -> Any:
    """Serve a public name from the module that owns it (:data:`_OWNERS`), once."""
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'accelreg' has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # later lookups are plain attribute reads (resolve() is hot)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
