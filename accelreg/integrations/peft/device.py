"""peft's device: adapters are staged on the registry's backend.

``peft.utils.other.infer_device`` returns ``"cuda"`` first and knows no musa/sdaa/hpu. The
replacement returns the registry's current backend in peft's own form — a device *type*
(``"npu"``, ``"cpu"``), which peft's callers compare with ``tensor.device.type``.
"""

from __future__ import annotations

import functools
from typing import Any

from ... import registry
from ...resolution import current_in_use

__all__ = ["infer_device"]


def infer_device(original: Any) -> Any:
    """The replacement of ``peft.utils.other.infer_device`` (``original``)."""

    @functools.wraps(original)
    def infer_device() -> str:

        current = current_in_use(registry.get())
        return "cpu" if current.name == "cpu" else current.device_type

    return infer_device
