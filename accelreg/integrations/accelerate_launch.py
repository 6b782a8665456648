"""accelerate's command line (``accelerate launch``, ``accelerate config default``,
``accelerate env``): the launcher counts, selects and masks the registry backend's devices.

The seams are :data:`accelreg.integrations.accelerate.LAUNCHER` (see that module); this module
is their integration's name, enabled under ``install()`` when ``accelerate.commands.launch`` is
imported — in the ``accelerate`` command's own process, never in a training process.
"""

from __future__ import annotations

from .accelerate import LAUNCHER

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]

INTEGRATION = LAUNCHER

enable, disable, enabled = INTEGRATION.api()
