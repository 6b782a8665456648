"""The standalone ``lightning_fabric`` package (distribution ``lightning-fabric``, also bundled
in ``pytorch-lightning``): Lightning Fabric under its other import name.

The same Fabric seams as the ``lightning`` row (built from its seam list by
:func:`~accelreg.integrations.lightning.integration.integration_for`), patched in ``lightning_fabric``;
enabled under ``install()`` when ``lightning_fabric`` is imported (``pytorch_lightning`` imports
it first, so both are enabled in a Trainer process).
"""

from __future__ import annotations

from .accelerator import RegistryAccelerator
from .flavors import FLAVORS
from .integration import integration_for

__all__ = ["INTEGRATION", "RegistryAccelerator", "disable", "enable", "enabled"]

INTEGRATION = integration_for(FLAVORS["lightning_fabric"])

enable, disable, enabled = INTEGRATION.api()
