"""peft: adapters are staged on the registry's device.

Seam: ``peft.utils.other.infer_device`` (public; imported by name into six more modules). It
returns ``"cuda"`` first, knows no musa/sdaa/hpu, and gives a bare type without an index. The
replacement returns the registry's device for this process (``"npu:1"`` under LOCAL_RANK=1),
which ``load_peft_weights`` and ``PeftModel.load_adapter`` use to stage adapter tensors.

Where adapters end up needs no seam: peft already moves each adapter to the device of the
layer it wraps (``BaseTunerLayer._move_adapter_to_device_of_base_layer``); the integration tests
prove it on a model spread over emulated devices.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._seams import Integration, Seam

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]


def _infer_device(original: Any) -> Any:
    @functools.wraps(original)
    def infer_device() -> str:
        from ..resolution import resolve

        return str(resolve())

    return infer_device


INTEGRATION = Integration(
    name="peft",
    distribution="peft",
    supported=">=0.21,<0.22",
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
            fingerprint="01773a49a4ebf0f7",
            why="stage adapter weights on the registry's device (not cuda-first)",
        )
    ],
    scan_prefixes=("peft", "transformers"),
)


def enable() -> None:
    """Enable the peft integration (idempotent)."""
    INTEGRATION.enable()


def disable() -> None:
    """Restore peft exactly as it was."""
    INTEGRATION.disable()


@contextmanager
def enabled() -> Iterator[None]:
    """Enable for a block."""
    with INTEGRATION.enabled_for():
        yield
