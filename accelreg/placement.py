"""Quantized-weight placement rules: which rule applies, and applying it when state is loaded.

A placement rule (yielded by plugins through ``accelreg_placement_rules``) says which
state-dict keys belong to a quantized parameter and where they must be before the module's own
loader runs. :func:`attach` puts a load-state-dict pre-hook and post-hook on every module a
rule governs. The pre-hook moves the travelling keys to the device of the live parameter
(resolved through the registry), drops keys the loader must not see and lets the rule's
``before_load`` adapter do library-specific work; the post-hook runs ``after_load`` and
records what happened (see :func:`load_events`).

The hooks live on the modules, so every caller of ``load_state_dict`` gets them: DeepSpeed's
``load_checkpoint``, Trainer, accelerate and plain torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import re
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from .errors import PlacementError
from .types import PlacementRule

__all__ = [
    "QUANT_METHODS",
    "attach",
    "detach",
    "live_device",
    "load_events",
    "names_class",
    "own_rule",
    "placement_rule",
    "rule_for_module",
    "target_device",
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


_BACKEND = re.compile(r"\*|[a-z][a-z0-9_]{0,63}")
_METHOD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_COUNTS = ("bytes_per_row", "block_size", "bytes_per_block", "fixed_bytes")
_KEY_TUPLES = ("travelling_keys", "dropped_keys")


def own_rule(rule: Any) -> PlacementRule:
    """A validated copy of a rule a plugin yielded, which the plugin cannot change afterwards.

    Every field is copied (fields added later included); the ones the planner and the load
    hooks compute with are checked: a backend name or ``"*"``, a quantization method name,
    qualified class names, parameter and state-dict key names, ``offload`` within
    ``{"cpu", "disk"}``, ``0 < bits_per_element <= 64``, non-negative integer byte counts and
    callables. Raises ``ValueError`` naming the first problem.
    """
    if not isinstance(rule, PlacementRule):
        raise ValueError(f"{type(rule).__name__} is not a PlacementRule")
    values = {f.name: getattr(rule, f.name) for f in dataclasses.fields(PlacementRule)}
    for name, pattern in (("backend", _BACKEND), ("quant_method", _METHOD), ("param", _KEY)):
        value = values[name]
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"{name} must be a name, got {_short(value)}")
        values[name] = str.__str__(value)
    for name, pattern in (("module_classes", _CLASS), *((k, _KEY) for k in _KEY_TUPLES)):
        values[name] = _names(name, values[name], pattern, empty_ok=name != "module_classes")
    offload = values["offload"]
    if not isinstance(offload, (set, frozenset)) or not all(isinstance(o, str) for o in offload):
        raise ValueError(f"offload must be a set of 'cpu'/'disk', got {_short(offload)}")
    offload = frozenset(str.__str__(o) for o in offload)
    if not offload <= {"cpu", "disk"}:
        raise ValueError(f"offload may name only 'cpu' and 'disk', got {sorted(offload)}")
    values["offload"] = offload
    bits = values["bits_per_element"]
    if isinstance(bits, bool) or not isinstance(bits, (int, float)):
        raise ValueError(f"bits_per_element must be a number, got {_short(bits)}")
    bits = operator.index(bits) if isinstance(bits, int) else float.__float__(bits)
    if not (math.isfinite(bits) and 0 < bits <= 64):
        raise ValueError(f"bits_per_element must be in (0, 64], got {bits!r}")
    values["bits_per_element"] = bits
    for name in _COUNTS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or operator.index(value) < 0:
            raise ValueError(f"{name} must be a non-negative int, got {_short(value)}")
        values[name] = operator.index(value)
    for name in ("provider", "unsupported"):
        if not isinstance(values[name], str):
            raise ValueError(f"{name} must be a string, got {_short(values[name])}")
        values[name] = str.__str__(values[name])
    for name in ("before_load", "after_load"):
        if values[name] is not None and not callable(values[name]):
            raise ValueError(f"{name} must be callable or None")
    return PlacementRule(**values)


def _names(field: str, value: Any, pattern: re.Pattern[str], *, empty_ok: bool) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(v, str) and pattern.fullmatch(v) for v in value
    ):
        raise ValueError(f"{field} must be a tuple of names, got {_short(value)}")
    if not value and not empty_ok:
        raise ValueError(f"{field} is empty: the rule would govern no module")
    return tuple(str.__str__(v) for v in value)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile value; its type is enough
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


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
    from . import registry

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
    from . import registry

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
    from .resolution import resolve

    return resolve(live_device(module, rule))


def _backend_of(device: Any) -> str:
    from . import registry

    if device.type == "cpu":
        return "cpu"
    for b in registry.get().order:
        if b.device_type == device.type:
            return b.name
    return device.type


def _travels(suffix: str, rule: PlacementRule) -> bool:
    return any(suffix == k or (k.endswith(".") and suffix.startswith(k)) for k in rule.travelling_keys)


# -- applying the rules on load -----------------------------------------------------------
_STATE = "_accelreg_placement"  # in module.__dict__ (never setattr: a Parameter would register)
_PENDING = "_accelreg_placement_pending"
_EVENTS_PER_MODULE = 64
_seq = itertools.count()
_seq_lock = threading.Lock()


class _Attached:
    """What :func:`attach` left on one module: its rule, hook handles and recent events."""

    __slots__ = ("events", "post", "pre", "rule")

    def __init__(self, rule: PlacementRule, pre: Any, post: Any) -> None:
        self.rule, self.pre, self.post = rule, pre, post
        self.events: deque[dict[str, Any]] = deque(maxlen=_EVENTS_PER_MODULE)


def _rule_now(module: Any, attached: _Attached) -> PlacementRule:
    """The rule for the backend the module lives on *now* (DeepSpeed or accelerate may have
    moved it since :func:`attach`); the attached rule when that backend has none for it."""
    try:
        device = getattr(module, attached.rule.param).device
        if device.type == "meta":
            return attached.rule
        return rule_for_module(module, _backend_of(device)) or attached.rule
    except Exception:  # noqa: BLE001 - a registry problem must not hide the attached rule
        return attached.rule


def _pre_hook(
    module: Any,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    attached: _Attached | None = module.__dict__.get(_STATE)
    if attached is None:
        return
    module.__dict__.pop(_PENDING, None)
    rule = attached.rule
    keys = [k for k in state_dict if k.startswith(prefix) and _travels(k[len(prefix) :], rule)]
    if not keys:
        return  # nothing of this layer in the checkpoint (an adapter-only state dict)
    now = _rule_now(module, attached)
    if now is not rule:
        rule = now
        keys = [k for k in state_dict if k.startswith(prefix) and _travels(k[len(prefix) :], rule)]
    device = target_device(module, rule)
    for suffix in rule.dropped_keys:
        state_dict.pop(prefix + suffix, None)
    for key in keys:
        value = state_dict.get(key)
        if hasattr(value, "to") and getattr(value, "device", device) != device:
            state_dict[key] = value.to(device)
    param = getattr(module, rule.param)
    event: dict[str, Any] = {
        "module": prefix[:-1],
        "quant_method": rule.quant_method,
        "device": str(device),
        "param_in_checkpoint": prefix + rule.param in state_dict,
        "keys": sorted(k[len(prefix) :] for k in keys),
    }
    if hasattr(param, "ds_shape"):
        event["zero3_partitioned"] = True
    if rule.before_load is not None:
        rule.before_load(module, state_dict, prefix, device, event)
    module.__dict__[_PENDING] = (rule, event)


def _post_hook(module: Any, incompatible_keys: Any) -> None:
    pending = module.__dict__.pop(_PENDING, None)
    attached: _Attached | None = module.__dict__.get(_STATE)
    if pending is None or attached is None:
        return
    rule, event = pending
    if rule.after_load is not None:
        rule.after_load(module, event)
    if not event["param_in_checkpoint"]:
        event.setdefault(
            "note",
            f"the checkpoint lacks {event['module'] or type(module).__name__}.{rule.param} "
            "(frozen parameters excluded?); the live value was kept and the key stays missing",
        )
    with _seq_lock:
        event["seq"] = next(_seq)
    attached.events.append(event)


def _first_device(module: Any) -> Any:
    for tensors in (getattr(module, "_parameters", {}), getattr(module, "_buffers", {})):
        for value in tensors.values():
            if value is not None:
                return value.device
    return None


def attach(model: Any, *, backend: str | None = None) -> dict[str, int]:
    """Attach load hooks applying the placement rules to every quantized module of ``model``.

    Idempotent (a module already attached, by this call or an integration, is counted and left
    as is). The hooks live on the modules, so every caller of ``load_state_dict`` gets them.
    Returns ``{quant_method: modules}``. ``backend`` overrides the backend whose rules apply
    (default: the backend of each module's own device, looked up again at each load).
    """
    counts: dict[str, int] = {}
    for _, module in model.named_modules():
        attached: _Attached | None = module.__dict__.get(_STATE)
        if attached is None:
            device = _first_device(module)
            if device is None:
                continue
            if device.type == "meta":
                device = _meta_exec(module)
            rule = rule_for_module(module, backend or _backend_of(device))
            if rule is None or not hasattr(module, rule.param):
                continue
            pre = module.register_load_state_dict_pre_hook(_pre_hook)
            hooks = getattr(module, "_load_state_dict_pre_hooks", None)
            if hooks is not None and hasattr(hooks, "move_to_end"):
                hooks.move_to_end(pre.id, last=False)  # before the library's own pre-hooks
            post = module.register_load_state_dict_post_hook(_post_hook)
            attached = module.__dict__[_STATE] = _Attached(rule, pre, post)
        method = attached.rule.quant_method
        counts[method] = counts.get(method, 0) + 1
    return counts


def _meta_exec(module: Any) -> Any:
    import torch

    execution = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    return torch.device(execution) if execution is not None else torch.device("cpu")


def detach(model: Any) -> int:
    """Remove the hooks :func:`attach` added; returns how many modules had them."""
    removed = 0
    for _, module in model.named_modules():
        attached = module.__dict__.pop(_STATE, None)
        module.__dict__.pop(_PENDING, None)
        if attached is not None:
            attached.pre.remove()
            attached.post.remove()
            removed += 1
    return removed


def load_events(model: Any, *, clear: bool = False) -> list[dict[str, Any]]:
    """What the placement hooks did on loads into ``model``'s modules, oldest first.

    Each event names the module (its key prefix in the loaded state dict), ``quant_method``,
    the ``device`` the travelling keys were placed on, the ``keys`` that travelled, whether the
    checkpoint carried the quantized parameter (``param_in_checkpoint``; when not, ``note``
    says the live value was kept) and what the rule's adapter did. The last 64 events of each
    module are kept; ``clear`` forgets them after reading.
    """
    events: list[dict[str, Any]] = []
    for _, module in model.named_modules():
        attached: _Attached | None = module.__dict__.get(_STATE)
        if attached is not None:
            events.extend(attached.events)
            if clear:
                attached.events.clear()
    events.sort(key=lambda e: e["seq"])
    return [dict(e) for e in events]
