"""Quantized-weight placement rules: which rule applies, and applying it when state is loaded.

A placement rule (yielded by plugins through ``accelreg_placement_rules``) says which
state-dict keys belong to a quantized parameter and where they must be before the module's own
loader runs. :func:`attach` puts a load-state-dict pre-hook and post-hook on every module a
rule governs: the pre-hook moves the travelling keys to the device of the live parameter
(resolved through the registry), drops keys the loader must not see and lets the rule's
``before_load`` adapter do library-specific work; the post-hook runs ``after_load`` and
records what happened (see :func:`load_events`).
"""

from __future__ import annotations

from typing import Any

from .errors import PlacementError
from .types import PlacementRule

__all__ = ["QUANT_METHODS", "attach", "detach", "load_events", "placement_rule", "rule_for_module"]

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


# -- applying the rules on load -----------------------------------------------------------
_HOOKS = "_accelreg_placement_hooks"
_PENDING = "_accelreg_placement_pending"
_EVENTS = "_accelreg_placement_events"
_MAX_EVENTS = 10_000


def _class_names(cls: type) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def rule_for_module(module: Any, backend: str) -> PlacementRule | None:
    """The placement rule governing ``module`` on ``backend``, or ``None`` if none applies."""
    from . import registry

    names = _class_names(type(module))
    best: tuple[int, PlacementRule] | None = None
    for plugin, rule in registry.get().rules(backend):
        if rule.backend not in (backend, "*") or not any(n in rule.module_classes for n in names):
            continue
        score = (2 if rule.backend == backend else 0) + (0 if plugin.builtin else 1)
        if best is None or score > best[0]:
            best = (score, rule)
    return None if best is None else best[1]


def live_device(module: Any, rule: PlacementRule) -> Any:
    """Where ``module``'s quantized parameter lives (its execution device when offloaded)."""
    param = getattr(module, rule.param)
    device = param.device
    if device.type == "meta":
        hook = getattr(module, "_hf_hook", None)
        execution = getattr(hook, "execution_device", None)
        if execution is None:
            raise PlacementError(
                f"{type(module).__name__}.{rule.param} is on the meta device and no offload hook names its "
                "execution device; cannot place its quantized state"
            )
        return execution
    return device


def target_device(module: Any, rule: PlacementRule) -> Any:
    """The device the travelling keys must be on: the live parameter's, resolved (validated)
    through the registry — never a device name assumed by the caller."""
    from .resolution import resolve

    device = resolve(live_device(module, rule))
    if not rule.may_live_on(str(device)) and device.type != "meta":
        backend = _backend_of(device)
        if backend != "cpu":
            raise PlacementError(
                f"{type(module).__name__}: a {rule.quant_method} parameter may not live on {device} "
                f"(rule for {rule.backend} from {rule.provider or 'a plugin'})"
            )
    return device


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
    rule: PlacementRule = module.__dict__[_HOOKS][0]
    keys = [k for k in state_dict if k.startswith(prefix) and _travels(k[len(prefix) :], rule)]
    if not keys:
        return  # nothing of this layer in the checkpoint (an adapter-only state dict)
    device = target_device(module, rule)
    for suffix in rule.dropped_keys:
        state_dict.pop(prefix + suffix, None)
    for key in keys:
        value = state_dict.get(key)
        if hasattr(value, "to"):
            state_dict[key] = value.to(device)
    event: dict[str, Any] = {
        "module": prefix[:-1],
        "quant_method": rule.quant_method,
        "device": str(device),
        "param_in_checkpoint": prefix + rule.param in state_dict,
    }
    if rule.before_load is not None:
        rule.before_load(module, state_dict, prefix, device, event)
    module.__dict__[_PENDING] = event


def _post_hook(module: Any, incompatible_keys: Any) -> None:
    event = module.__dict__.pop(_PENDING, None)
    if event is None:
        return
    rule, events = module.__dict__[_HOOKS][0], module.__dict__[_HOOKS][1]
    if rule.after_load is not None:
        rule.after_load(module, event)
    if not event["param_in_checkpoint"]:
        event["note"] = f"the checkpoint lacks {event['module']}.{rule.param} (frozen parameters excluded?); live value kept"
    if len(events) < _MAX_EVENTS:
        events.append(event)


def attach(model: Any, *, backend: str | None = None) -> dict[str, int]:
    """Attach load hooks applying the placement rules to every quantized module of ``model``.

    Idempotent. The hooks live on the modules, so every caller of ``load_state_dict`` gets them
    (DeepSpeed, Trainer, accelerate, plain torch). Returns ``{quant_method: modules}``.
    ``backend`` overrides the backend whose rules apply (default: each module's own device's).
    """
    events = model.__dict__.setdefault(_EVENTS, [])
    counts: dict[str, int] = {}
    for _, module in model.named_modules():
        if _HOOKS in module.__dict__:
            rule = module.__dict__[_HOOKS][0]
            counts[rule.quant_method] = counts.get(rule.quant_method, 0) + 1
            continue
        weight = getattr(module, "_parameters", {}).get("weight")
        if weight is None:
            continue
        device = weight.device if weight.device.type != "meta" else _meta_exec(module)
        rule = rule_for_module(module, backend or _backend_of(device))
        if rule is None:
            continue
        pre = module.register_load_state_dict_pre_hook(_pre_hook)
        hooks = getattr(module, "_load_state_dict_pre_hooks", None)
        if hooks is not None and hasattr(hooks, "move_to_end"):
            hooks.move_to_end(pre.id, last=False)  # before the library's own pre-hooks
        post = module.register_load_state_dict_post_hook(_post_hook)
        module.__dict__[_HOOKS] = (rule, events, pre, post)
        counts[rule.quant_method] = counts.get(rule.quant_method, 0) + 1
    return counts


def _meta_exec(module: Any) -> Any:
    import torch

    hook = getattr(module, "_hf_hook", None)
    execution = getattr(hook, "execution_device", None)
    return torch.device(execution) if execution is not None else torch.device("cpu")


def detach(model: Any) -> None:
    """Remove the hooks :func:`attach` added."""
    for _, module in model.named_modules():
        hooks = module.__dict__.pop(_HOOKS, None)
        if hooks is not None:
            hooks[2].remove()
            hooks[3].remove()


def load_events(model: Any) -> list[dict[str, Any]]:
    """What the placement hooks did on each load into ``model`` (oldest first): module,
    quant_method, device, whether the checkpoint carried the parameter, and notes."""
    return list(model.__dict__.get(_EVENTS, ()))
