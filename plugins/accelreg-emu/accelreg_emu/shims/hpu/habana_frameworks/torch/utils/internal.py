"""Stand-in for ``habana_frameworks.torch.utils.internal``."""

from __future__ import annotations


def is_lazy() -> bool:
    """The emulator runs eagerly (like PT_HPU_LAZY_MODE=0)."""
    return False
