"""accelerate's ``load_state``: model states load through the cpu onto a registry device that
safetensors does not list.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ... import registry


def _load_accelerator_state(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def load_accelerator_state(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as exc:  # safetensors' own error type is private to its Rust module
            bound = signature.bind(*args, **kwargs)
            device = original.__globals__["PartialState"]().device
            if (
                bound.arguments.get("map_location") != "on_device"
                or "invalid" not in str(exc)
                or not _registry_device_type(device)
            ):
                raise
        # safetensors parses device names itself, from a fixed list: the model states of a
        # registry device type it does not list load through the cpu, and load_state_dict (and the
        # optimizer's) copy each tensor onto the device of what it fills — what loading there
        # directly gives. The first model failed before anything was loaded, so this starts over.
        bound.arguments["map_location"] = "cpu"
        return original(*bound.args, **bound.kwargs)

    return load_accelerator_state


def _registry_device_type(device: Any) -> bool:
    """Whether ``device`` (``"emu:1"``, ``torch.device``) is on a registry accelerator's type."""
    kind = str(device).partition(":")[0]
    return kind != "cpu" and any(b.device_type == kind for b in registry.get().order)
