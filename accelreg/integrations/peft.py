"""peft: adapters are staged on the registry's device.

Seam: ``peft.utils.other.infer_device`` (public; imported by name into six more modules; one
shape in peft 0.17-0.21). It returns ``"cuda"`` first and knows no musa/sdaa/hpu. The
replacement returns the registry's current backend in peft's own form — a device *type*
(``"npu"``, ``"cpu"``), which peft's callers compare with ``tensor.device.type`` — and
``load_peft_weights`` / ``PeftModel.load_adapter`` stage adapter tensors there. The indexed
device for this process (``npu:1`` under LOCAL_RANK=1) is :func:`accelreg.resolve`.

Where adapters end up needs no seam: peft already moves each adapter to the device of the
layer it wraps (``BaseTunerLayer._move_adapter_to_device_of_base_layer``); the integration tests
prove it on a model spread over emulated devices.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import registry
from ..resolution import current_in_use
from .seams import Adapter, Integration, Seam

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]


def _infer_device(original: Any) -> Any:
    @functools.wraps(original)
    def infer_device() -> str:

        current = current_in_use(registry.get())
        return "cpu" if current.name == "cpu" else current.device_type

    return infer_device


INTEGRATION = Integration(
    name="peft",
    distribution="peft",
    trigger="peft",
    releases=">=0.17,<0.22",
    tested={"oldest": "0.17.1", "middle": "0.19.1", "newest": "0.21.2"},
    seams=[
        Seam(
            "peft.utils.other",
            "infer_device",
            _infer_device,
            importers=(
                "peft.utils",
                "peft.utils.save_and_load",
                "peft.peft_model",
                "peft.utils.hotswap",
                "peft.optimizers.lorafa",
                "peft.tuners.lora.monteclora",
            ),
            why="stage adapter weights on the registry's backend (not cuda-first)",
            adapters=(Adapter(">=0.17,<0.22", _infer_device, shapes=("1a138aaf7722ef16",)),),
        )
    ],
    scan_prefixes=("peft", "transformers"),
)


enable, disable, enabled = INTEGRATION.api()
