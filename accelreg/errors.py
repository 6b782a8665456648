"""The exception types accelreg raises.

Every error accelreg raises on bad input derives from :class:`AccelregError`. The value
errors also derive from :class:`ValueError`, so code written against torch's own
``torch.device("bogus")`` failures keeps working.
"""

from __future__ import annotations

__all__ = [
    "AccelregError",
    "ConfigError",
    "DeviceError",
    "DeviceMapError",
    "IntegrationError",
    "MetaModelError",
    "PlacementError",
    "PluginConflictError",
    "PluginError",
    "UsageError",
]


class AccelregError(Exception):
    """Base class of every accelreg error."""


class DeviceError(AccelregError, ValueError):
    """A device spec that cannot be resolved to a device that exists here.

    The message always names what *is* available, e.g.
    ``"npu:3" is out of range: npu has 2 devices (npu:0, npu:1)``.
    """


class DeviceMapError(AccelregError, ValueError):
    """A device map that breaks a placement rule, or a model that cannot fit at all.

    ``violations`` holds one human-readable line per problem found.
    """

    def __init__(self, message: str, violations: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[str, ...] = tuple(violations)


class ConfigError(AccelregError, ValueError):
    """Invalid configuration: a malformed file, a bad value, a bad environment variable."""


class PluginError(AccelregError, RuntimeError):
    """A backend plugin failed to load or to answer (raised only in strict mode)."""


class PluginConflictError(PluginError):
    """Two external plugins register the same backend name and configuration picks neither."""


class PlacementError(AccelregError, RuntimeError):
    """Quantized state that cannot be placed where its placement rule requires."""


class IntegrationError(AccelregError, RuntimeError):
    """An integration cannot be enabled (untested library version, missing seam)."""


class MetaModelError(AccelregError, ValueError):
    """What was given cannot be built into a model on the meta device (an unknown model type, a
    malformed ``config.json``, a task the type has no head for); ``accelreg plan`` exits 2."""


class UsageError(AccelregError, ValueError):
    """A bad command-line value (``accelreg`` exits 2)."""
