"""accelerate's modeling utilities: memory, cache, dispatch and tensor moves ask the registry
(``get_max_memory``, ``clear_device_cache``, ``dispatch_model``, ``set_module_tensor_to_device``
with bitsandbytes quantize-on-move on every accelerator its placement rules allow).
"""

from __future__ import annotations

import functools
import gc
from typing import Any

from ... import registry
from ...errors import DeviceError, PlacementError
from ...resolution import current_in_use, qualify

_MODELING = "accelerate.utils.modeling"


def _size(value: Any) -> int:
    from accelerate.utils.modeling import convert_file_size_to_int

    return int(convert_file_size_to_int(value))


def _get_max_memory(original: Any) -> Any:
    @functools.wraps(original)
    def get_max_memory(max_memory: dict[Any, Any] | None = None) -> dict[Any, int]:

        snap = registry.get()
        current = current_in_use(snap)
        if max_memory is None:
            out: dict[Any, int] = {}
            if current.name != "cpu":
                for i in range(current.count):
                    info = current.memory(i)
                    out[i] = info.free if info is not None else 0
            host = snap.backend("cpu").memory(0)
            out["cpu"] = host.free if host is not None else 0
            return out
        return original(_indexed_keys(max_memory, current))

    return get_max_memory


def _indexed_keys(max_memory: dict[Any, Any], current: Any) -> dict[Any, Any]:
    """``max_memory`` with qualified keys of the current backend as indices; every other key
    as given (accelerate checks those itself). Keys are rewritten in place, as upstream
    rewrites the values in place."""
    import torch

    for key in list(max_memory):
        text = str(key) if isinstance(key, torch.device) else key
        if not isinstance(text, str) or ":" not in text:
            continue
        name, _, index = text.partition(":")
        if name in (current.name, current.device_type) and index.isdecimal():
            max_memory[int(index)] = max_memory.pop(key)
        elif name not in ("cpu", "disk"):
            raise DeviceError(
                f"max_memory key {key!r} is a {name} device, but accelerate plans for the current backend "
                f"{current.name} (int keys, or {current.name}:<index>, 'cpu', 'disk')"
            )
    return max_memory


def _clear_device_cache(original: Any) -> Any:
    @functools.wraps(original)
    def clear_device_cache(garbage_collection: bool = False) -> None:
        import torch

        if garbage_collection:
            gc.collect()
        current = registry.get().current()
        if current.name == "cpu":
            return
        module = getattr(torch, current.device_type, None)
        empty = getattr(module, "empty_cache", None)
        if callable(empty):
            empty()

    return clear_device_cache


def _first_accelerator(device_map: dict[str, Any]) -> Any:
    for value in device_map.values():
        if value not in ("cpu", "disk") and str(value) not in ("cpu", "disk", "meta"):
            return value
    return None


def _dispatch_model(original: Any) -> Any:
    @functools.wraps(original)
    def dispatch_model(
        model: Any, device_map: dict[str, Any], main_device: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        if main_device is None and isinstance(device_map, dict):
            main_device = _first_accelerator(device_map)
        return original(model, device_map, main_device, *args, **kwargs)

    return dispatch_model


def _qualified(device: Any) -> Any:
    """Ints and backend names become qualified device strings; cpu/meta/disk stay."""
    import torch

    if isinstance(device, str) and device in ("cpu", "meta", "disk"):
        return device
    if isinstance(device, (int, str, torch.device)):  # a bool raises TypeError in qualify
        return qualify(device)
    return device


def _set_module_tensor_to_device(original: Any) -> Any:
    @functools.wraps(original)
    def set_module_tensor_to_device(
        module: Any, tensor_name: str, device: Any, value: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        device = _qualified(device)
        param = getattr(module, "_parameters", {}).get(tensor_name)
        if param is not None and _quantize_on_move(module, param, device):
            return _move_quantized(module, tensor_name, device, value, param, *args, **kwargs)
        return original(module, tensor_name, device, value, *args, **kwargs)

    return set_module_tensor_to_device


def _quantize_on_move(module: Any, param: Any, device: Any) -> bool:
    """Whether ``param`` is a not-yet-quantized parameter of a module a placement rule governs,
    moving to an accelerator where the rule lets it live."""
    import torch

    if not isinstance(device, str) or device in ("cpu", "meta", "disk"):
        return False
    if type(param).__name__ not in ("Int8Params", "Params4bit", "FP4Params"):
        return False
    target = torch.device(device)
    if param.device.type == target.type:
        return False
    from ... import placement  # at first use, not in install()

    backend = placement.backend_of(target)
    rule = placement.rule_for_module(module, backend)
    return rule is not None and rule.may_live_on(device)


def _move_quantized(
    module: Any, name: str, device: str, value: Any, param: Any, *args: Any, **kwargs: Any
) -> None:
    """What accelerate does for its two device types, for any accelerator: build the parameter
    on the CPU, then move it; bitsandbytes quantizes during the move."""
    import torch

    dtype = kwargs.get("dtype", args[0] if args else None)
    fp16_statistics = kwargs.get("fp16_statistics", args[1] if len(args) > 1 else None)
    source = value if value is not None else param
    if source.device.type == "meta":
        raise PlacementError(f"{type(module).__name__}.{name}: no value given and the parameter is on meta")
    with torch.no_grad():
        data = source.to("cpu")
        if dtype is not None and data.is_floating_point():
            data = data.to(dtype)
        if type(param).__name__ == "Int8Params" and data.dtype == torch.float32:
            data = data.to(torch.float16)  # as accelerate: needed for 8-bit serialization
        attrs = {k: v for k, v in param.__dict__.items() if k != "_is_hf_initialized"}
        new = type(param)(data, requires_grad=param.requires_grad, **attrs).to(device)
        if fp16_statistics is not None:
            new.SCB = fp16_statistics.to(device)
    module._parameters[name] = new
