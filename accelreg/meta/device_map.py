"""The patch-free path: a fully qualified device map for a model, without patching anything."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _warn
from ..deferred import raise_recorded
from ..planner import no_split_classes, plan
from ..planner.budgets import missing_devices
from .build import build_meta_model

__all__ = ["device_map_for"]


def device_map_for(
    model: Any,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    strategy: str = "balanced",
    dtype: Any = None,
    no_split_module_classes: list[str] | None = None,
    quantization: str | None = None,
    task: str | None = None,
    model_class: Any = None,
) -> dict[str, str]:
    """A fully qualified device map for ``model``, planned without patching anything.

    Args:
        model: A model (on meta or not), a transformers config, a model type (``"gpt2"``), a
            ``config.json`` or a local checkpoint folder (its ``config.json`` is read; weights
            are not).
        max_memory: Budgets as for :func:`accelreg.plan_device_map` (``{"npu:0": "20GiB",
            "cpu": "64GiB", "disk": "1TB"}``; int keys are indices of the current backend);
            default: the registry's devices of the current backend and the host.
        strategy: ``"balanced"`` (default), ``"auto"``, ``"balanced_low_0"`` or ``"sequential"``.
        dtype: The dtype the weights will be loaded in (default: the model's own).
        no_split_module_classes: Module classes never split (default: the model's own).
        quantization: ``"8bit"`` / ``"4bit"`` to plan bitsandbytes weights.
        task: When ``model`` is built here, its head: a key of :data:`TASKS`
            (``"masked-lm"``); default: causal LM, else seq2seq LM, else the base model.
        model_class: When ``model`` is built here, the transformers model class (or its name)
            to build instead of a task's.

    Returns:
        ``{module name: "npu:0" | "cpu" | "disk"}``: tied parameter groups on one device, every
        value a device of the registry — pass it to ``from_pretrained(device_map=...)`` or
        ``accelerate.dispatch_model`` on any transformers release, without ``install()``.
        When something is offloaded, *every* accelerator the map uses keeps the headroom to run
        the largest offloaded layer: stock accelerate (1.15+) runs offloaded layers on a
        hash-ordered pick among them, and ``from_pretrained`` cannot be told which. That can
        keep fewer bytes on the accelerators than :func:`accelreg.plan_device_map` (whose map
        is for ``install()``, or for ``dispatch_model(..., main_device=...)``); see
        docs/planner.md.

    Warns (``RuntimeWarning``) when the map places weights on devices this process does not
    have (planning for another machine is allowed; loading the map here would fail), naming
    why each is unavailable. Raises ``ModuleNotFoundError`` naming the ``accelreg[hf]`` extra
    when building ``model`` needs transformers and it is not installed.
    """
    raise_recorded()
    if not hasattr(model, "named_parameters"):
        model, _ = build_meta_model(model, task=task, model_class=model_class)
    elif task is not None or model_class is not None:
        raise TypeError("task and model_class choose the head of a model built from a config, not of a model")
    if no_split_module_classes is None:
        no_split_module_classes = no_split_classes(model, "auto") or None
    result = plan(
        model,
        dict(max_memory) if max_memory is not None else None,
        no_split_module_classes=no_split_module_classes,
        strategy=strategy,
        dtype=dtype,
        quantization=quantization,
        any_main=True,
    )
    device_map = dict(result.device_map)
    missing = missing_devices(device_map.values())
    if missing:
        by_reason: dict[str, list[str]] = {}
        for place, why in missing.items():
            by_reason.setdefault(why, []).append(place)
        lines = "; ".join(f"{', '.join(places)}: {why}" for why, places in by_reason.items())
        _warn.warn_once(
            f"device_map_for placed weights on {len(missing)} device(s) this process does not have ({lines}); "
            "the map is for a machine that has them (pass max_memory for this one, or load it there)"
        )
    return device_map
