"""transformers: ``from_pretrained(device_map=...)`` asks the registry.

Seams (transformers 5.24; private functions are fingerprinted, see docs/integrations.md):

* ``integrations.accelerate.check_and_set_device_map`` — normalises ``device_map``. Upstream
  turns only the exact string ``"cuda"`` into ``cuda:LOCAL_RANK``, keeps ints and dict values
  as given (torch then maps ints to whatever it calls "the accelerator") and accepts ``True``.
  The replacement resolves every int, backend name, device string and ``torch.device``
  through :func:`accelreg.resolve` — LOCAL_RANK-aware for every backend — and keeps ``"disk"``
  inside dicts. A backend that is not available here (``"cuda"`` on an Ascend node) is refused
  with a :class:`~accelreg.DeviceError` naming what is available; it is never remapped.
* ``integrations.accelerate._get_device_map`` — plans ``"auto"``/``"balanced"``/
  ``"balanced_low_0"``/``"sequential"`` with transformers' copy of accelerate's planner and
  ladders. The replacement plans with :func:`accelreg.plan_device_map` (tied weights declared
  by the model kept together, budgets from the registry, the quantizer's ``adjust_max_memory``
  and ``validate_environment`` applied as upstream does) and validates user-written maps with
  :func:`accelreg.check_device_map`. A bitsandbytes load that a planned or written map sends to
  a device type bitsandbytes does not support is refused, as for the default map below.
* ``integrations.accelerate.expand_device_map`` — matches keys as unescaped regexes without a
  name boundary (``"model.layers.1"`` captures ``model.layers.10``) and silently sends
  unmatched parameters to ``""`` or cpu. The replacement matches the longest dotted prefix and
  raises for an uncovered parameter.
* ``Bnb8BitHfQuantizer/Bnb4BitHfQuantizer.update_device_map`` — the default map of a
  quantized load (cuda > npu > hpu > xpu, else silently cpu). The replacement uses the
  registry's device, and refuses a backend bitsandbytes does not support.
* ``quantizers.base.HfQuantizer.postprocess_model`` — after loading, the placement rules are
  attached to the model, so any later ``load_state_dict`` (DeepSpeed, Trainer, accelerate,
  torch) places quantized state correctly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._seams import LIBRARIES, Integration, Seam

__all__ = ["INTEGRATION", "STRATEGIES", "disable", "enable", "enabled", "normalize_device_map"]

log = logging.getLogger("accelreg.integrations.transformers")

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_TIA = "transformers.integrations.accelerate"


def normalize_device_map(device_map: Any) -> Any:
    """``device_map`` with every device resolved through the registry.

    Strategies and ``None`` are returned as they are; anything else becomes a dict of fully
    qualified device strings (``{"": "npu:0"}``), with ``"disk"`` allowed only as a dict value.
    """
    import torch

    from ..resolution import qualify, resolve

    if device_map is None or (isinstance(device_map, str) and device_map in STRATEGIES):
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
        f"device_map must be None, one of {', '.join(STRATEGIES)}, an int, a device string, a torch.device "
        f"or a dict, got {type(device_map).__name__}"
    )


def _check_and_set_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def check_and_set_device_map(device_map: Any) -> Any:
        return original(normalize_device_map(device_map))

    return check_and_set_device_map


def _budgets(max_memory: dict[Any, Any] | None) -> dict[str, int]:
    from .. import planner
    from ..resolution import qualify

    if max_memory is None:
        return dict(planner.default_max_memory())
    return {
        qualify(key) if not isinstance(key, str) or key not in ("cpu", "disk") else key: value
        for key, value in max_memory.items()
    }


def _get_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def _get_device_map(model: Any, device_map: Any, max_memory: Any, hf_quantizer: Any) -> Any:
        import accelreg

        from ..sizes import parse_size

        if getattr(model, "_no_placement_params", None) is not None:
            log.info(
                "%s declares _no_placement_params; planning with transformers' own planner",
                type(model).__name__,
            )
            return original(model, normalize_device_map(device_map), max_memory, hf_quantizer)
        if isinstance(device_map, dict):
            device_map = normalize_device_map(device_map)
            accelreg.check_device_map(model, device_map)
            _refuse_unsupported_bnb(hf_quantizer, device_map)
            return device_map
        if device_map is None:
            return None
        budgets = {key: parse_size(value) for key, value in _budgets(max_memory).items()}
        if hf_quantizer is not None:
            budgets = {key: int(value) for key, value in hf_quantizer.adjust_max_memory(budgets).items()}
        plan = accelreg.plan_device_map(
            model,
            budgets,
            no_split_module_classes=sorted(model._no_split_modules or ()),
            strategy=device_map,
        )
        _refuse_unsupported_bnb(hf_quantizer, plan)
        if hf_quantizer is not None:
            hf_quantizer.validate_environment(device_map=plan)
        return plan

    return _get_device_map


def _expand_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def expand_device_map(device_map: dict[str, Any] | None, param_names: list[str]) -> dict[str, Any]:
        from ..errors import DeviceMapError

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


def _check_bnb_device(device: Any, where: str) -> None:
    """Raise :class:`~accelreg.PlacementError` when bitsandbytes does not run on ``device``."""
    import bitsandbytes

    from ..errors import PlacementError

    supported = getattr(bitsandbytes, "supported_torch_devices", None)
    if supported is not None and device.type not in supported:
        raise PlacementError(
            f"bitsandbytes {getattr(bitsandbytes, '__version__', '')} cannot run on {device.type} "
            f"(it supports {', '.join(sorted(supported))}); {where} is {device}: "
            "pass device_map='cpu' to quantize on the CPU, or choose another backend"
        )


def _refuse_unsupported_bnb(hf_quantizer: Any, device_map: dict[str, Any]) -> None:
    """The check of a default bitsandbytes map, for planned and user-written maps too: a
    bitsandbytes load onto a device type bitsandbytes does not support is refused."""
    import torch

    config = getattr(hf_quantizer, "quantization_config", None)
    method = getattr(config, "quant_method", None)
    if "bitsandbytes" not in str(getattr(method, "value", method) or ""):
        return
    for key, value in device_map.items():
        if str(value) not in ("cpu", "disk", "meta"):
            _check_bnb_device(torch.device(value), f"device_map[{key!r}]")


def _update_device_map(original: Any) -> Any:
    @functools.wraps(original)
    def update_device_map(self: Any, device_map: Any) -> Any:
        if device_map is not None:
            return device_map
        from ..resolution import resolve

        device = resolve()
        _check_bnb_device(device, "the registry's device")
        return {"": str(device)}

    return update_device_map


def _postprocess_model(original: Any) -> Any:
    @functools.wraps(original)
    def postprocess_model(self: Any, model: Any, **kwargs: Any) -> Any:
        from .. import placement

        result = original(self, model, **kwargs)
        placement.attach(model)
        return result

    return postprocess_model


INTEGRATION = Integration(
    name="transformers",
    distribution="transformers",
    supported=">=5.24,<5.25",
    seams=[
        Seam(
            _TIA,
            "check_and_set_device_map",
            _check_and_set_device_map,
            params=("device_map",),
            importers=("transformers.modeling_utils",),
            fingerprint="db357c9a225aaa8c",
            why="resolve ints, backend names and devices in device_map through the registry",
        ),
        Seam(
            _TIA,
            "_get_device_map",
            _get_device_map,
            params=("model", "device_map", "max_memory", "hf_quantizer"),
            importers=("transformers.modeling_utils",),
            fingerprint="8eda91cde8320e2a",
            why="plan strategies with accelreg.plan_device_map; validate user maps",
        ),
        Seam(
            _TIA,
            "expand_device_map",
            _expand_device_map,
            params=("device_map", "param_names"),
            importers=("transformers.modeling_utils",),
            fingerprint="9894d0c8ddc2f442",
            why="longest-dotted-prefix matching; no silent fallback",
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_8bit",
            "Bnb8BitHfQuantizer.update_device_map",
            _update_device_map,
            params=("self", "device_map"),
            fingerprint="88d442cd5be19af8",
            why="default device of an 8-bit load from the registry",
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_4bit",
            "Bnb4BitHfQuantizer.update_device_map",
            _update_device_map,
            params=("self", "device_map"),
            fingerprint="88d442cd5be19af8",
            why="default device of a 4-bit load from the registry",
        ),
        Seam(
            "transformers.quantizers.base",
            "HfQuantizer.postprocess_model",
            _postprocess_model,
            params=("self", "model"),
            why="attach the quantized-weight placement rules after loading",
        ),
    ],
    scan_prefixes=LIBRARIES,
)


def enable() -> None:
    """Enable the transformers integration (idempotent)."""
    INTEGRATION.enable()


def disable() -> None:
    """Restore transformers exactly as it was."""
    INTEGRATION.disable()


@contextmanager
def enabled() -> Iterator[None]:
    """Enable for a block."""
    with INTEGRATION.enabled_for():
        yield
