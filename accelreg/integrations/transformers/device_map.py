"""Device maps at load time: ``device_map`` ints, backend names and devices resolved through the
registry, ``"auto"`` and the strategy words planned by accelreg's tied-weight-aware planner, and
``model.hf_device_map`` kept in transformers' own form.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any

import accelreg

from ... import registry
from ...errors import DeviceMapError
from ...resolution import current_in_use, qualify, resolve
from ...sizes import parse_size
from .quantizers import _refuse_unsupported_bnb

log = logging.getLogger("accelreg.integrations.transformers")


def _strategies() -> tuple[str, ...]:
    """The ``device_map`` words that ask for a plan (the planner's strategy words). The planner
    is imported on first use, not with this module: ``install()`` imports every integration
    module in each process of a job, and most never plan a map."""
    from ... import planner

    return tuple(planner.STRATEGIES)


_TIA = "transformers.integrations.accelerate"


_MU = "transformers.modeling_utils"


@dataclass
class _Load:
    """What one ``from_pretrained`` call tells the seams it runs through."""

    offload_folder: Any = None
    host_form: dict[str, Any] | None = None  # hf_device_map as transformers itself would give it
    kernels_asked: bool = False  # use_kernels or kernel_config given (not transformers' default)


_load: contextvars.ContextVar[_Load | None] = contextvars.ContextVar("accelreg_load", default=None)


def normalize_device_map(device_map: Any) -> Any:
    """``device_map`` with every device resolved through the registry.

    Strategies and ``None`` are returned as they are; anything else becomes a dict of fully
    qualified device strings (``{"": "npu:0"}``), with ``"disk"`` allowed only as a dict value.
    """
    import torch

    if device_map is None or (isinstance(device_map, str) and device_map in _strategies()):
        return device_map
    if isinstance(device_map, dict):
        out = {}
        for key, value in device_map.items():
            if not isinstance(key, str):
                raise TypeError(f"device_map keys are module names (str), got {key!r}")
            out[key] = qualify(value)
        return out
    if isinstance(device_map, (bool, int, str, torch.device)):
        return {"": str(resolve(device_map))}
    raise TypeError(
        f"device_map must be None, one of {', '.join(_strategies())}, an int, a device string, a torch.device "
        f"or a dict, got {type(device_map).__name__}"
    )


def _check_and_set_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def check_and_set_device_map(device_map: Any) -> Any:
        result = original(normalize_device_map(device_map))
        load = _load.get()
        if load is not None and isinstance(result, dict):
            try:  # what upstream alone makes of the user's value: the form hf_device_map shows
                upstream = original(device_map)
            except Exception:  # noqa: BLE001 - upstream would have refused it; keep ours
                upstream = None
            load.host_form = dict(upstream) if isinstance(upstream, dict) else None
        return result

    return check_and_set_device_map


def _host_value(value: str, accelerator: str | None) -> Any:
    """A planned map's value as accelerate's planner writes it: an int index on the current
    accelerator, ``"cpu"``/``"disk"`` as they are."""
    name, _, index = value.partition(":")
    if accelerator is not None and name == accelerator and index.isdecimal():
        return int(index)
    return value


def _planned_host_form(plan: dict[str, str]) -> dict[str, Any]:

    current = current_in_use(registry.get())
    accelerator = None if current.name == "cpu" else current.device_type
    return {key: _host_value(value, accelerator) for key, value in plan.items()}


def _budgets(max_memory: dict[Any, Any] | None) -> dict[str, Any]:

    if max_memory is None:
        from ... import planner

        out: dict[str, Any] = dict(planner.default_max_memory())
    else:
        out = {
            qualify(key) if not isinstance(key, str) or key not in ("cpu", "disk") else key: value
            for key, value in max_memory.items()
        }
    load = _load.get()
    if "disk" not in out and load is not None and load.offload_folder is not None:
        out["disk"] = _disk_free(load.offload_folder)  # offload_folder opts in to disk offload
    return out


def _disk_free(folder: Any) -> int:
    """Free bytes of the file system ``folder`` is (or will be created) on."""
    path = os.path.abspath(os.fspath(folder))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return int(shutil.disk_usage(path).free)


def _get_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def _get_device_map(model: Any, device_map: Any, max_memory: Any, hf_quantizer: Any, *more: Any) -> Any:
        return _plan_for_load(original, model, device_map, max_memory, hf_quantizer, *more)

    return _get_device_map


def _plan_for_load(
    original: Any, model: Any, device_map: Any, max_memory: Any, hf_quantizer: Any, *more: Any
) -> Any:
    """Validate a written map or plan a strategy (every adapter of ``_get_device_map``; 4.57
    passes ``dtype`` and ``keep_in_fp32_regex`` as well, which planning on meta needs not)."""

    load = _load.get()
    if getattr(model, "_no_placement_params", None) is not None:
        log.info(
            "%s declares _no_placement_params; planning with transformers' own planner",
            type(model).__name__,
        )
        return original(model, normalize_device_map(device_map), max_memory, hf_quantizer, *more)
    if isinstance(device_map, dict):
        if load is not None and load.host_form is None:
            load.host_form = dict(device_map)  # 4.57: from_pretrained normalised it inline
        device_map = normalize_device_map(device_map)
        accelreg.check_device_map(model, device_map)
        _refuse_unsupported_bnb(hf_quantizer, device_map)
        return device_map
    if device_map is None:
        return None
    from ... import planner

    budgets = {key: parse_size(value) for key, value in _budgets(max_memory).items()}
    if hf_quantizer is not None:
        budgets = {key: int(value) for key, value in hf_quantizer.adjust_max_memory(budgets).items()}
    plan = accelreg.plan_device_map(  # through the facade, as every caller sees it
        model,
        budgets,
        no_split_module_classes=planner.no_split_classes(model, device_map),
        strategy=device_map,
    )
    _refuse_unsupported_bnb(hf_quantizer, plan)
    if hf_quantizer is not None:
        hf_quantizer.validate_environment(device_map=plan)
    if load is not None:
        load.host_form = _planned_host_form(plan)
    return plan


def _from_pretrained(original: Any) -> Any:
    @functools.wraps(original)
    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        load = _Load(
            offload_folder=kwargs.get("offload_folder"),
            kernels_asked=kwargs.get("use_kernels") is not None or kwargs.get("kernel_config") is not None,
        )
        token = _load.set(load)
        try:
            model = original(cls, *args, **kwargs)
        finally:
            _load.reset(token)
        shown = getattr(model, "hf_device_map", None)
        if load.host_form is not None and isinstance(shown, dict) and set(shown) == set(load.host_form):
            model.hf_device_map = dict(load.host_form)  # transformers' own value forms
        return model

    return from_pretrained


def _expand_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def expand_device_map(device_map: dict[str, Any] | None, param_names: list[str]) -> dict[str, Any]:

        if device_map is None:
            return dict.fromkeys(param_names, "cpu")
        out = {}
        for param in param_names:
            name = param
            while True:
                if name in device_map:
                    out[param] = device_map[name]
                    break
                if not name:
                    raise DeviceMapError(
                        f"the device map does not cover {param!r} (and has no '' entry)", [param]
                    )
                name = name.rpartition(".")[0]
        return out

    return expand_device_map
