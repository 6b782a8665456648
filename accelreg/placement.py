"""Quantized-weight placement rules: which rule applies, and (later) applying it on load."""

from __future__ import annotations

from .errors import PlacementError
from .types import PlacementRule

__all__ = ["QUANT_METHODS", "placement_rule"]

#: Accepted spellings of each quantization method.
QUANT_METHODS = {
    "bnb_8bit": "bnb_8bit",
    "8bit": "bnb_8bit",
    "int8": "bnb_8bit",
    "bnb_4bit": "bnb_4bit",
    "4bit": "bnb_4bit",
    "nf4": "bnb_4bit",
    "fp4": "bnb_4bit",
}


def placement_rule(backend: str, quant_method: str) -> PlacementRule:
    """The placement rule for ``quant_method`` weights on ``backend``.

    A rule for the exact backend beats a generic (``"*"``) one, and a rule from an external
    plugin beats a built-in one. Raises :class:`~accelreg.errors.PlacementError` when no
    plugin has a rule for the pair.
    """
    from . import registry

    if not isinstance(backend, str) or not isinstance(quant_method, str):
        raise TypeError("placement_rule(backend, quant_method) takes two strings")
    method = QUANT_METHODS.get(quant_method, quant_method)
    best: tuple[int, PlacementRule] | None = None
    for plugin, rule in registry.get().rules(backend):
        if rule.quant_method != method or rule.backend not in (backend, "*"):
            continue
        score = (2 if rule.backend == backend else 0) + (0 if plugin.builtin else 1)
        if best is None or score > best[0]:
            best = (score, rule)
    if best is None:
        known = sorted({r.quant_method for _, r in registry.get().rules(backend)})
        raise PlacementError(
            f"no placement rule for {quant_method!r} on {backend!r}; known methods: {', '.join(known) or 'none'}"
        )
    return best[1]
