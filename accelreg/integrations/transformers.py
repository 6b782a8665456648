"""transformers: ``from_pretrained(device_map=...)`` asks the registry.

Seams, each with one adapter per known shape (transformers 4.57 and 5.0-5.25; private
functions are matched by :func:`~accelreg.integrations.seams.shape`, see docs/compatibility.md):

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
* ``modeling_utils.PreTrainedModel.from_pretrained`` (public) — carries ``offload_folder`` to
  the planner (it counts as a disk budget, as upstream's planner offloads to disk when it is
  given) and gives ``model.hf_device_map`` back in transformers' own value forms (ints for
  accelerator indices of a planned map, the user's own values for a map the user wrote),
  while loading itself uses fully qualified devices.

* ``integrations.hub_kernels.kernelize`` — transformers 5.25 kernelizes every
  ``from_pretrained`` by default once the ``kernels`` package is installed, and then (a) reads
  an int device-map value as a device (``device_map={"": 1}``: ``'int' object has no attribute
  'type'``, on any accelerator) and (b) hands the device type to the kernels library, which
  refuses every type outside its own list (``Unsupported device type '<type>'``): a backend the
  registry knows, loading any model, fails. The replacement qualifies int values through the
  registry and, when kernels were not asked for (the default) and the kernels library does not
  run on the device type (asked by :func:`hub_kernels_support`, a behaviour probe of its public
  ``kernelize``), leaves the model's own torch layers in place, as upstream's fallback does
  for a layer without a kernel: ``model.use_kernels`` reads ``False``. An explicit request
  (``use_kernels=True`` or a ``kernel_config``) is passed through, so the kernels library's own
  error answers it.
  Releases before 5.13 have no ``kernelize`` there; 5.13-5.24 kernelize only on request.

transformers 4.57 has no ``check_and_set_device_map`` (``from_pretrained`` normalises inline,
then calls ``modeling_utils._get_device_map``, whose 4.57 adapter qualifies every dict value
through the registry) and its ``expand_device_map`` already matches exact dotted prefixes
(nothing to fix there).
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

from .. import registry
from ..errors import DeviceMapError, PlacementError
from ..resolution import current_in_use, qualify, resolve
from ..sizes import parse_size
from .seams import LIBRARIES, Adapter, Integration, Seam

__all__ = [
    "INTEGRATION",
    "disable",
    "enable",
    "enabled",
    "hub_kernels_support",
    "normalize_device_map",
]

log = logging.getLogger("accelreg.integrations.transformers")


def _strategies() -> tuple[str, ...]:
    """The ``device_map`` words that ask for a plan (the planner's strategy words). The planner
    is imported on first use, not with this module: ``install()`` imports every integration
    module in each process of a job, and most never plan a map."""
    from .. import planner

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
        from .. import planner

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
    from .. import planner

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


def _check_bnb_device(device: Any, where: str) -> None:
    """Raise :class:`~accelreg.PlacementError` when bitsandbytes does not run on ``device``."""
    import bitsandbytes

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


@functools.cache
def hub_kernels_support(device_type: str) -> bool:
    """Whether the installed ``kernels`` library accepts ``device_type`` (a torch device type):
    its public ``kernelize`` is run on an empty module for that type (a behaviour probe, no list
    of names).

    ``False`` also when ``kernels`` is not installed. The patch-free path uses it too: where it
    is ``False`` on a transformers that kernelizes by default (5.25), pass
    ``from_pretrained(..., use_kernels=False)`` (or set ``USE_HUB_KERNELS=0``).
    """
    try:
        import kernels
        import torch
    except ImportError:
        return False
    try:
        kernels.kernelize(torch.nn.Module(), mode=kernels.Mode.INFERENCE, device=device_type)
    except ValueError:
        return False
    except Exception as exc:  # noqa: BLE001 - an unforeseen answer: let upstream speak for itself
        log.debug("kernels.kernelize probe for %r raised %s: %s", device_type, type(exc).__name__, exc)
    return True


def _kernels_device_type(model: Any, device_map: dict[str, Any] | None) -> str:
    """The device type transformers' kernelize works on: the first accelerator of the map,
    else the model's device."""
    import torch

    for value in (device_map or {}).values():
        if str(value) not in ("cpu", "disk", "meta"):
            return torch.device(value).type
    return torch.device(model.device).type


def _kernelize(original: Any) -> Any:
    @functools.wraps(original)
    def kernelize(
        model: Any, mode: Any = None, kernel_config: Any = None, device_map: Any = None, **more: Any
    ) -> Any:

        if isinstance(device_map, dict):  # an int is an index of the registry's backend, not a device
            device_map = {k: qualify(v) if isinstance(v, int) else v for k, v in device_map.items()}
        load = _load.get()
        if load is not None and not load.kernels_asked:  # transformers' default, not a request
            device_type = _kernels_device_type(model, device_map)
            if not hub_kernels_support(device_type):
                log.info(
                    "the kernels library does not run on %r: %s keeps its torch layers "
                    "(from_pretrained(use_kernels=True) asks for kernels anyway)",
                    device_type,
                    type(model).__name__,
                )
                return None
        return original(model, mode=mode, kernel_config=kernel_config, device_map=device_map, **more)

    return kernelize


#: Shapes (:func:`~accelreg.integrations.seams.shape`) of the private functions, per release
#: family, read from every release in the window (docs/compatibility.md lists them).
_CHECK_5 = ("35e14fb17d5bcc80",)  # 5.0-5.25
_GET_5 = (
    "a89d9d3600a50ab0",  # 5.0
    "ef4a0fdf552b5108",  # 5.1-5.3
    "095d5534432bf2f5",  # 5.4-5.15 (the reserved-memory loop moved into get_max_memory)
    "cca7d7e6d5492798",  # 5.16-5.25 (_no_placement_params)
)
_GET_457 = ("e9bc406151511616",)  # 4.57.x: modeling_utils, with dtype and keep_in_fp32_regex
_EXPAND_5 = ("a36395b8a9c8deb5",)  # 5.0-5.25: one unanchored regex of the keys
_EXPAND_457 = ("ce57bc8aa6fb2737",)  # 4.57.x: exact dotted prefixes (nothing to fix)
_BNB8 = ("73df0f3df692e403", "0273761cb2b0d6c2", "0292ddef364a88a2")  # 4.57 / 5.0-5.3 / 5.4+
_BNB4 = ("0273761cb2b0d6c2", "0292ddef364a88a2")  # 4.57-5.3 / 5.4+
_GET_PARAMS = ("model", "device_map", "max_memory", "hf_quantizer")
_KERNELIZE_DEFAULT = ("88a2f4cb507e77bb",)  # 5.25: from_pretrained kernelizes unless told not to
_KERNELIZE_ON_REQUEST = (
    "224b780e922dca67",  # 5.13-5.14
    "4c5b39b1181aa626",  # 5.15-5.16
    "0a8cd555efc5c538",  # 5.17
    "ee5d16ffe5a160bf",  # 5.18
    "b5c5c32882de9f2a",  # 5.19
    "5d37e3b6dde5c4b9",  # 5.20-5.22
    "5d744bb7f1c9f19b",  # 5.23-5.24
)
_HK = "transformers.integrations.hub_kernels"

#: The releases the integration serves, and the two lines of them whose seams differ.
RELEASES = "~=4.57.0 | >=5.0,<5.26"
_V4, _V5 = "~=4.57.0", ">=5.0,<5.26"

INTEGRATION = Integration(
    name="transformers",
    distribution="transformers",
    trigger="transformers.modeling_utils",
    releases=RELEASES,
    tested={"oldest": "4.57.6", "middle": "5.3.0", "newest": "5.25.0"},
    seams=[
        Seam(
            _TIA,
            "check_and_set_device_map",
            importers=(_MU,),
            why="resolve ints, backend names and devices in device_map through the registry",
            adapters=(
                Adapter(_V5, _check_and_set_device_map, shapes=_CHECK_5, params=("device_map",)),
                Adapter(
                    _V4,
                    None,
                    shapes=_GET_457,
                    module=_MU,
                    target="_get_device_map",
                    note="inline in from_pretrained; _get_device_map qualifies",
                ),
            ),
        ),
        Seam(
            _TIA,
            "_get_device_map",
            importers=(_MU,),
            why="plan strategies with accelreg.plan_device_map; validate user maps",
            adapters=(
                Adapter(_V5, _get_device_map, shapes=_GET_5, params=_GET_PARAMS),
                Adapter(
                    _V4,
                    _get_device_map,
                    shapes=_GET_457,
                    params=(*_GET_PARAMS, "dtype", "keep_in_fp32_regex"),
                    module=_MU,
                ),
            ),
        ),
        Seam(
            _TIA,
            "expand_device_map",
            importers=(_MU,),
            why="longest-dotted-prefix matching; no silent fallback",
            adapters=(
                Adapter(_V5, _expand_device_map, shapes=_EXPAND_5, params=("device_map", "param_names")),
                Adapter(_V4, None, shapes=_EXPAND_457, module=_MU, note="exact prefixes already"),
            ),
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_8bit",
            "Bnb8BitHfQuantizer.update_device_map",
            why="default device of an 8-bit load from the registry",
            adapters=(Adapter(RELEASES, _update_device_map, shapes=_BNB8, params=("self", "device_map")),),
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_4bit",
            "Bnb4BitHfQuantizer.update_device_map",
            why="default device of a 4-bit load from the registry",
            adapters=(Adapter(RELEASES, _update_device_map, shapes=_BNB4, params=("self", "device_map")),),
        ),
        Seam(
            "transformers.quantizers.base",
            "HfQuantizer.postprocess_model",
            _postprocess_model,
            params=("self", "model"),
            why="attach the quantized-weight placement rules after loading",
        ),
        Seam(
            _HK,
            "kernelize",
            importers=(_MU,),
            why="hub kernels by default: int device-map values resolved, and a device type the kernels "
            "library does not run on keeps the model's torch layers instead of failing the load",
            adapters=(
                Adapter(
                    ">=5.25,<5.26",
                    _kernelize,
                    shapes=_KERNELIZE_DEFAULT,
                    params=("model", "mode", "kernel_config", "device_map"),
                    note="by default",
                ),
                Adapter(
                    ">=5.13,<5.25",
                    None,
                    shapes=_KERNELIZE_ON_REQUEST,
                    params=("model", "mode"),
                    note="on request only",
                ),
                Adapter("~=4.57.0 | >=5.0,<5.13", None, absent=True),
            ),
            instead="pass from_pretrained(..., use_kernels=False) or set USE_HUB_KERNELS=0 where the kernels "
            "library does not run on your backend (accelreg.integrations.transformers.hub_kernels_support)",
        ),
        Seam(
            _MU,
            "PreTrainedModel.from_pretrained",
            _from_pretrained,
            params=("cls", "pretrained_model_name_or_path"),
            why="offload_folder counts as a disk budget; hf_device_map keeps transformers' value forms",
        ),
    ],
    scan_prefixes=LIBRARIES,
)


enable, disable, enabled = INTEGRATION.api()
