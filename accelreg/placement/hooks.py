"""Applying placement rules when state is loaded: the load-state-dict hooks and their report."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any

from ..types import PlacementRule
from .rules import backend_of, rule_for_module, target_device, travels

__all__ = ["attach", "detach", "load_events"]

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
        return rule_for_module(module, backend_of(device)) or attached.rule
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
    keys = [k for k in state_dict if k.startswith(prefix) and travels(k[len(prefix) :], rule)]
    if not keys:
        return  # nothing of this layer in the checkpoint (an adapter-only state dict)
    now = _rule_now(module, attached)
    if now is not rule:
        rule = now
        keys = [k for k in state_dict if k.startswith(prefix) and travels(k[len(prefix) :], rule)]
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
            rule = rule_for_module(module, backend or backend_of(device))
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
