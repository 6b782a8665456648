"""Stand-in for ``habana_frameworks.torch.core`` (``htcore``): eager mode, so steps are no-ops."""

from __future__ import annotations

import torch

from habana_frameworks.torch import _active  # noqa: F401  (activates the emulator)

hpu = torch.hpu


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Lazy-mode graph boundary: the emulator runs eagerly, so nothing to do."""


def is_initialized() -> bool:
    return True


__all__ = ["hpu", "is_initialized", "mark_step"]
