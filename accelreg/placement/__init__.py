"""Quantized-weight placement: which rule applies, and applying it when state is loaded.

A placement rule (yielded by plugins through ``accelreg_placement_rules``) says which
state-dict keys belong to a quantized parameter and where they must be before the module's own
loader runs.

* :mod:`.rules` — :func:`placement_rule` (the public lookup by backend and method) and
  :func:`rule_for_module`; which device a module's quantized state belongs on.
* :mod:`.hooks` — :func:`attach` puts a load-state-dict pre-hook and post-hook on every module
  a rule governs. The pre-hook moves the travelling keys to the device of the live parameter
  (resolved through the registry), drops keys the loader must not see and lets the rule's
  ``before_load`` adapter do library-specific work; the post-hook runs ``after_load`` and records
  what happened (:func:`load_events`).

The hooks live on the modules, so every caller of ``load_state_dict`` gets them: DeepSpeed's
``load_checkpoint``, Trainer, accelerate and plain torch. The registry validates each rule a
plugin yields (:func:`accelreg.registry.records.own_rule`) before anything here sees it.
"""

from __future__ import annotations

from ..registry.records import own_rule
from .hooks import attach, detach, load_events
from .rules import (
    QUANT_METHODS,
    backend_of,
    live_device,
    names_class,
    placement_rule,
    rule_for_module,
    target_device,
)

__all__ = [
    "QUANT_METHODS",
    "attach",
    "backend_of",
    "detach",
    "live_device",
    "load_events",
    "names_class",
    "own_rule",
    "placement_rule",
    "rule_for_module",
    "target_device",
]
