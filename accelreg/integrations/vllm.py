"""vLLM (prototype)."""
from __future__ import annotations

from .. import registry


def chosen_backend() -> str:
    return registry.get().current().name
