"""The standalone ``pytorch_lightning`` package (distribution ``pytorch-lightning``): Lightning's
Trainer under its other import name.

The same seams as the ``lightning`` row (built from its seam list by
:func:`~accelreg.integrations.lightning.integration.integration_for`), patched in ``pytorch_lightning``;
enabled under ``install()`` when ``pytorch_lightning`` is imported. Fabric's half
(``lightning_fabric``, bundled in the same distribution) is
:mod:`accelreg.integrations.lightning.fabric`.
"""

from __future__ import annotations

from .accelerator import RegistryAccelerator
from .flavors import FLAVORS
from .integration import integration_for

__all__ = ["INTEGRATION", "RegistryAccelerator", "disable", "enable", "enabled"]

INTEGRATION = integration_for(FLAVORS["pytorch_lightning"])

enable, disable, enabled = INTEGRATION.api()
