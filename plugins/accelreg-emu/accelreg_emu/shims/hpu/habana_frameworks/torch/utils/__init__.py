"""Stand-in for ``habana_frameworks.torch.utils``."""

from __future__ import annotations

from . import experimental, internal  # noqa: F401
