"""Which placement rule applies: to a (backend, quantization method) pair, or to a module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import registry, resolution
from ..errors import PlacementError
from ..types import PlacementRule

__all__ = [
    "QUANT_METHODS",
    "backend_of",
    "live_device",
    "names_class",
    "placement_rule",
    "rule_for_module",
    "target_device",
    "travels",
]

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


def _score(plugin: Any, rule: PlacementRule, backend: str) -> int:
    # exact backend (2) beats "*" (0); an external plugin (1) beats a built-in (0)
    return (2 if rule.backend == backend else 0) + (0 if plugin.builtin else 1)


def _best(candidates: Any, backend: str) -> PlacementRule | None:
    best: tuple[int, PlacementRule] | None = None
    for plugin, rule in candidates:
        score = _score(plugin, rule, backend)
        if best is None or score > best[0]:  # ties: the first registered wins
            best = (score, rule)
    return None if best is None else best[1]


def placement_rule(backend: str, quant_method: str) -> PlacementRule:
    """The placement rule for ``quant_method`` weights on ``backend``.

    A rule for the exact backend beats a generic (``"*"``) one, and a rule from an external
    plugin beats a built-in one. Raises :class:`~accelreg.errors.PlacementError` when
    ``backend`` is not registered, no plugin has a rule for the pair, or the rule says the
    method cannot run there (``PlacementRule.unsupported``).
    """
    if not isinstance(backend, str) or not isinstance(quant_method, str):
        raise TypeError("placement_rule(backend, quant_method) takes two strings")
    snap = registry.get()
    names = [b.name for b in snap.order]
    if backend not in names:
        raise PlacementError(f"no backend named {backend!r} is registered; registered: {', '.join(names)}")
    method = QUANT_METHODS.get(quant_method, quant_method)
    rules = snap.rules(backend)
    found = _best(
        ((p, r) for p, r in rules if r.quant_method == method and r.backend in (backend, "*")), backend
    )
    if found is None:
        known = sorted({r.quant_method for _, r in rules if r.backend in (backend, "*")})
        raise PlacementError(
            f"no placement rule for {quant_method!r} on {backend!r}; known methods: {', '.join(known) or 'none'}"
        )
    if found.unsupported:
        raise PlacementError(f"{method} weights cannot be placed on {backend!r}: {found.unsupported}")
    return found


def names_class(module_classes: Sequence[str], cls: type) -> bool:
    """Whether ``module_classes`` (a :class:`PlacementRule` field) names ``cls`` or a base class.

    Each entry is either a bare class name (``"Linear8bitLt"``) or a dotted path: the defining
    module's (``"bitsandbytes.nn.modules.Linear8bitLt"``) or a package above it that re-exports
    the class (``"bitsandbytes.nn.Linear8bitLt"``). Nothing is imported to decide.
    """
    for c in cls.__mro__:
        for entry in module_classes:
            where, _, name = entry.rpartition(".")
            if name != c.__name__ and entry != c.__qualname__:
                continue
            if not where or entry == c.__qualname__:
                return True
            if c.__module__ == where or c.__module__.startswith(where + "."):
                return True
            if f"{c.__module__}.{c.__qualname__}" == entry:
                return True
    return False


def rule_for_module(module: Any, backend: str) -> PlacementRule | None:
    """The placement rule governing ``module`` on ``backend``, or ``None`` if none applies.

    A rule governs a module whose class (or a base class) it names in ``module_classes``
    (see :func:`names_class`).
    """
    cls = type(module)
    return _best(
        (
            (p, r)
            for p, r in registry.get().rules(backend)
            if r.backend in (backend, "*") and names_class(r.module_classes, cls)
        ),
        backend,
    )


def live_device(module: Any, rule: PlacementRule) -> Any:
    """Where ``module``'s quantized parameter lives (its execution device when offloaded)."""
    device = getattr(module, rule.param).device
    if device.type == "meta":
        execution = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if execution is None:
            raise PlacementError(
                f"{type(module).__name__}.{rule.param} is on the meta device and no offload hook names its "
                "execution device; cannot place its quantized state"
            )
        import torch

        return torch.device(execution) if not isinstance(execution, torch.device) else execution
    return device


def target_device(module: Any, rule: PlacementRule) -> Any:
    """The device the travelling keys must be on before the module's loader runs: the device
    of the live quantized parameter, resolved (validated) through the registry. Never a device
    the caller assumed ("cuda"), never the checkpoint's (DeepSpeed always loads onto the cpu)."""
    return resolution.resolve(live_device(module, rule))


def backend_of(device: Any) -> str:
    """The registered backend whose devices have ``device``'s type (``device.type`` if none)."""
    if device.type == "cpu":
        return "cpu"
    for b in registry.get().order:
        if b.device_type == device.type:
            return b.name
    return device.type


def travels(suffix: str, rule: PlacementRule) -> bool:
    """Whether a state-dict key ending in ``suffix`` travels with the rule's quantized parameter."""
    return any(suffix == k or (k.endswith(".") and suffix.startswith(k)) for k in rule.travelling_keys)
