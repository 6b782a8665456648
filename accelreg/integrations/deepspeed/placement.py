"""DeepSpeed's placement seam: ``deepspeed.initialize`` attaches the quantized-weight placement
rules to the model before the engine is built, so ``engine.load_checkpoint`` (always onto the
CPU, with no ``map_location``) hands each quantized layer its state on the device of the live
weight (seed 000).
"""

from __future__ import annotations

import functools
from typing import Any

from ... import placement

__all__ = ["attached", "initialize"]

#: How many models (and quantized modules in them) had the placement rules attached.
attached = {"models": 0, "modules": 0}


# -- the seam -----------------------------------------------------------------------------
def initialize(original: Any) -> Any:
    """The replacement of ``deepspeed.initialize`` (``original``)."""

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:

        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if model is not None and hasattr(model, "named_modules"):
            counts = placement.attach(model)
            if counts:
                attached["models"] += 1
                attached["modules"] += sum(counts.values())
        return original(*args, **kwargs)

    return initialize
