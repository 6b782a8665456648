"""accelerate: memory, cache, dispatch, default device and quantize-on-move ask the registry.

Seams (accelerate 1.10-1.16; the first five public, matched by their parameters; every module
that imported them by name is patched too):

* ``accelerate.utils.modeling.get_max_memory`` — two 7-way ``is_*_available()`` ladders.
  Without ``max_memory`` the replacement reads the free memory of the registry's current
  backend. A given ``max_memory`` keeps accelerate's contract exactly (int keys stay as they
  are, unchecked against this machine: the caller may plan for another one); the one addition
  is that a qualified key of the current backend (``"npu:1"``) becomes its index instead of
  upstream's "not recognized" error, and a qualified key of another backend is a
  :class:`~accelreg.DeviceError`.
* ``accelerate.utils.memory.clear_device_cache`` — its own backend order (xpu first); the
  replacement empties the current backend's cache.
* ``accelerate.big_modeling.dispatch_model`` — picks ``main_device`` as ``list(set(...))[0]``,
  which for string devices depends on the hash seed; the wrapper passes the first accelerator
  of the map in forward order.
* ``accelerate.utils.modeling.set_module_tensor_to_device`` — int devices go through a ladder,
  and bitsandbytes parameters are quantized on the way only for two hard-coded device types.
  The wrapper qualifies every device through the registry and quantizes bitsandbytes
  parameters on the way to any accelerator whose placement rules allow them there.
* ``accelerate.state.PartialState.default_device`` — a ninth backend order; the replacement
  answers the registry's current backend in upstream's form (``torch.device("npu")``, no
  index; ``cpu``): which backend comes from the registry, the index stays the runtime's, as
  upstream. Effective for states created after ``enable()``.
* ``accelerate.state.PartialState._prepare_backend`` and ``.set_device`` (private or rebuilt:
  pinned to the shapes of 1.10-1.16) — a rank a launcher started on a registry accelerator gets
  accelerate's multi-process type, a process group over ``accelreg.dist_backend()`` and the
  device ``<backend>:<LOCAL_RANK>``; never a backend the registry would not choose, and never
  the cpu in silence (a :class:`~accelreg.DeviceError` naming the call).
* ``accelerate.checkpointing.load_accelerator_state`` — ``load_state`` onto a device type
  safetensors does not list loads the model states through the cpu.

:data:`LAUNCHER` is the second integration, ``accelerate_launch`` (accelerate's command line:
``accelerate launch``, ``accelerate config default``, ``accelerate env``), enabled when
``accelerate.commands.launch`` is imported.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
from typing import Any

from .. import placement, registry
from ..errors import DeviceError, PlacementError
from ..queries import dist_backend
from ..registry import Backend
from ..resolution import current_in_use, qualify, resolve
from .ds_accelerator import slots_under_mask
from .seams import LIBRARIES, Adapter, Integration, Seam

__all__ = ["INTEGRATION", "LAUNCHER", "RELEASES", "TESTED", "disable", "enable", "enabled"]

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


def _default_device(original: Any) -> Any:
    def default_device(self: Any) -> Any:
        import torch

        current = current_in_use(registry.get())
        if current.name == "cpu":
            return torch.device("cpu")
        return torch.device(current.device_type)  # upstream's form: the type, no index

    return property(default_device, doc="The registry's current backend, in accelerate's form (accelreg).")


# -- the ranks: PartialState's distributed type, process group and device ----------------------
def _launched() -> bool:
    """A launcher started this rank (accelerate's own test: ``LOCAL_RANK`` set)."""
    return int(os.environ.get("LOCAL_RANK", -1)) != -1


def _distributed_type(kinds: Any, backend: Backend) -> Any:
    """accelerate's multi-process type (of its enum ``kinds``) for ``backend``: its own
    ``MULTI_<DEVICE TYPE>`` where accelerate has one (npu, mlu, xpu, ...), else ``MULTI_GPU``,
    accelerate's generic one-process-per-device type (its launch paths are torchrun's; accelreg
    seams its device)."""
    try:
        return kinds(f"MULTI_{backend.device_type.upper()}")
    except ValueError:
        return kinds.MULTI_GPU


def _prepare_backend(original: Any) -> Any:
    @functools.wraps(original)
    def _prepare_backend(
        self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None
    ) -> Any:
        theirs = original(self, cpu, sagemaker_dp, backend)
        if cpu or sagemaker_dp or not _launched():
            return theirs
        kinds = original.__globals__["DistributedType"]
        if theirs[1] == kinds.XLA:
            return theirs
        chosen = current_in_use(registry.get())  # a present but failing backend: DeviceError
        if chosen.name == "cpu":
            if theirs[1] == kinds.MULTI_CPU:
                return theirs
            # accelerate's own detection found a backend the registry would not choose (disabled,
            # masked away, failing), or (1.16) no accelerator and so no process group at all: a
            # launched rank runs as accelerate's cpu ranks do, in one group over gloo
            return original(self, True, sagemaker_dp, backend)
        ours = _distributed_type(kinds, chosen)
        if theirs[1] == ours:
            return theirs  # accelerate knows this backend: its own set-up (imports, names) stands
        return (backend if backend is not None else dist_backend(chosen.name)), ours

    return _prepare_backend


def _set_device(original: Any) -> Any:
    @functools.wraps(original)
    def set_device(self: Any) -> None:
        if self.device is not None:
            return original(self)
        kinds = original.__globals__["DistributedType"]
        if self.distributed_type in (kinds.NO, kinds.MULTI_CPU, kinds.XLA) or getattr(self, "_cpu", False):
            original(self)
        else:
            snap = registry.get()
            chosen = current_in_use(snap)
            if chosen.name == "cpu":
                original(self)
            else:
                # the registry's device for this rank: <backend>:<LOCAL_RANK>, a DeviceError past
                # the backend's devices (accelerate wraps the rank around the device count)
                device = resolve()
                module = getattr(original.__globals__["torch"], device.type, None)
                if device.index is not None and callable(getattr(module, "set_device", None)):
                    module.set_device(device)
                self.device = device
        _never_silently_cpu(self, "accelerate.PartialState.set_device()")

    return set_device


def _asks_for_cpu() -> bool:
    """Whether ``ACCELERATE_USE_CPU`` asks for the cpu, read as accelerate reads it: with its own
    ``accelerate.utils.environment.parse_flag_from_env`` (in every served release, 1.10 to 1.16:
    y/yes/t/true/on/1, any case). A value accelerate refuses does not ask for the cpu."""
    from accelerate.utils.environment import parse_flag_from_env

    try:
        return bool(parse_flag_from_env("ACCELERATE_USE_CPU"))
    except ValueError:  # accelerate's "invalid truth value" (its own AcceleratorState raises it)
        return False


def _never_silently_cpu(state: Any, call: str) -> None:
    """A launcher-started rank that accelerate put on the cpu while the registry has an
    available accelerator, without the cpu being asked for (``cpu=True``, ``--cpu``,
    ``ACCELERATE_USE_CPU``): a :class:`DeviceError` naming the call, never a silent cpu job."""
    device = getattr(state, "device", None)
    if device is None or device.type != "cpu" or getattr(state, "_cpu", False):
        return
    if _asks_for_cpu():
        return
    snap = registry.get()
    if snap.launcher is None:
        return
    current = snap.current()
    if current.name == "cpu":
        return
    var, value = snap.launcher
    raise DeviceError(
        f"{call} put this process on the cpu (distributed type {state.distributed_type}), but the "
        f"registry's backend {current.name} is available here ({', '.join(current.info().devices())}) and "
        f"a launcher started this process ({var}={value}); accelreg will not run a job on the cpu silently. "
        "Ask for the cpu explicitly (accelerate launch --cpu, Accelerator(cpu=True)) or disable "
        f"{current.name} (ACCELREG_DISABLE={current.name})"
    )


def _load_accelerator_state(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def load_accelerator_state(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as exc:  # safetensors' own error type is private to its Rust module
            bound = signature.bind(*args, **kwargs)
            device = original.__globals__["PartialState"]().device
            if (
                bound.arguments.get("map_location") != "on_device"
                or "invalid" not in str(exc)
                or not _registry_device_type(device)
            ):
                raise
        # safetensors parses device names itself, from a fixed list: the model states of a
        # registry device type it does not list load through the cpu, and load_state_dict (and the
        # optimizer's) copy each tensor onto the device of what it fills — what loading there
        # directly gives. The first model failed before anything was loaded, so this starts over.
        bound.arguments["map_location"] = "cpu"
        return original(*bound.args, **bound.kwargs)

    return load_accelerator_state


def _registry_device_type(device: Any) -> bool:
    """Whether ``device`` (``"emu:1"``, ``torch.device``) is on a registry accelerator's type."""
    kind = str(device).partition(":")[0]
    return kind != "cpu" and any(b.device_type == kind for b in registry.get().order)


# -- the launcher: accelerate launch / accelerate config default / accelerate env ---------------
def _validate_launch_command(original: Any) -> Any:
    @functools.wraps(original)
    def _validate_launch_command(args: Any) -> Any:
        if not getattr(args, "cpu", False):
            _count_registry_devices(args, original.__globals__.get("default_config_file"))
        return original(args)

    return _validate_launch_command


def _gpu_ids(args: Any) -> list[str] | None:
    ids = getattr(args, "gpu_ids", None)
    if ids is None or str(ids).strip() in ("", "all"):
        return None
    return [i.strip() for i in str(ids).split(",") if i.strip()]


def _count_registry_devices(args: Any, default: str | None) -> None:
    """What accelerate's launcher decides from its own device ladder, decided from the registry
    (only where no config file decides it): the process count (the devices ``--gpu_ids`` selects,
    else every device of the current backend) and multi-process mode when that is more than one,
    exactly as upstream does for the devices it knows."""
    config = getattr(args, "config_file", None)
    if config is not None or (default is not None and os.path.isfile(default)):
        return  # the config file decides (accelerate config default writes the registry's count)
    chosen = current_in_use(registry.get())
    if chosen.name == "cpu":
        return
    ids = _gpu_ids(args)
    count = len(ids) if ids is not None else chosen.count
    if args.num_processes is None:
        args.num_processes = max(count, 1)
    if not args.multi_gpu and args.num_processes > 1 and count > 1:
        args.multi_gpu = True


def _mask(args: Any, env: dict[str, str]) -> None:
    """Replace the visible-devices variable accelerate set for ``--gpu_ids`` (from its own list
    of device types, ``CUDA_VISIBLE_DEVICES`` for a type it does not list) with the registry
    backend's variable, in place. Under a mask the launcher inherited (``accelreg run --devices
    1,3``) the ids are positions in it, as DeepSpeed's slots are: the job never leaves the
    devices it was given. Ids the backend does not have are a :class:`DeviceError`."""
    ids = _gpu_ids(args)
    if ids is None or getattr(args, "cpu", False) or getattr(args, "use_cpu", False):
        return
    chosen = current_in_use(registry.get())
    if chosen.name == "cpu":
        return
    var = chosen.spec.visible_devices_var
    if var is None:
        raise DeviceError(
            f"accelerate launch --gpu_ids {','.join(ids)}: {chosen.name} has no visible-devices variable"
        )
    value = ",".join(slots_under_mask(chosen.spec, os.environ, ids))
    if os.environ.get(var) is None:
        have = [str(i) for i in range(chosen.count)]
        missing = [i for i in ids if i not in have]
        if missing:
            raise DeviceError(
                f"accelerate launch --gpu_ids {','.join(ids)}: {chosen.name} has no device "
                f"{', '.join(missing)}: its devices here are {', '.join(have) or 'none'}"
            )
    for key, upstream in list(env.items()):
        if key != var and upstream == getattr(args, "gpu_ids", None) and os.environ.get(key) != upstream:
            if key in os.environ:
                env[key] = os.environ[key]
            else:
                del env[key]  # upstream's guess of the variable, for another device type
    env[var] = value


def _prepare_env(original: Any) -> Any:
    """For ``prepare_multi_gpu_env`` (returns the environment) and the simple and DeepSpeed
    launchers' ``prepare_*_cmd_env`` (return ``(command, environment)``)."""

    @functools.wraps(original)
    def prepare(args: Any) -> Any:
        out = original(args)
        _mask(args, out[1] if isinstance(out, tuple) else out)
        return out

    return prepare


def _write_basic_config(original: Any) -> Any:
    @functools.wraps(original)
    def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> Any:
        args = (mixed_precision,) if save_location is None else (mixed_precision, save_location)
        path = original(*args)
        if not path:
            return path
        chosen = current_in_use(registry.get())
        if chosen.name == "cpu":
            return path
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.utils import DistributedType

        config = load_config_from_file(str(path))
        config.num_processes = max(chosen.count, 1)
        config.use_cpu = False
        kind = _distributed_type(DistributedType, chosen) if chosen.count > 1 else DistributedType.NO
        config.distributed_type = kind.value
        config.to_json_file(path)
        return path

    return write_basic_config


def _env_command(original: Any) -> Any:
    @functools.wraps(original)
    def env_command(args: Any) -> Any:
        info = original(args)
        snap = registry.get()
        current = snap.current()
        if current.name == "cpu":
            text = "cpu (no accelerator is available; `accelreg env` says why)"
        else:
            devices = ", ".join(current.info().devices())
            text = f"{current.name} ({devices}; collectives {current.spec.dist_backend or 'undeclared'})"
        print(f"- accelreg registry backend: {text}")
        if isinstance(info, dict):
            info["accelreg registry backend"] = text
        return info

    return env_command


_PREPARE_PARAMS = ("self", "cpu", "sagemaker_dp", "backend")

#: Shapes (:func:`~accelreg.integrations.seams.shape`) of the private or rebuilt seams in the
#: window 1.10.1-1.16.0 (each wraps upstream and falls back to it for what is not the registry's
#: to decide; a new shape is looked at before it is trusted).
_SHAPES: dict[str, tuple[str, ...]] = {
    # 1.10-1.12 (the is_*_available ladder), 1.13, 1.14-1.15, 1.16 (torch.accelerator + a name table)
    "prepare_backend": ("ddc9e63fda615720", "f32aaabbd338151d", "03bc7498537b3f5e", "86cddedf64a26672"),
    # 1.10-1.12, 1.13-1.14, 1.15 (neuron), 1.16 (torch.get_device_module)
    "set_device": ("97c3f8fa52740d20", "28f85c6119baa1da", "5665fe13336acdfc", "0de2d40ec4178e4b"),
    # 1.10-1.12, 1.13, 1.14, 1.15, 1.16 (a ladder of device counts, then torch.accelerator)
    "validate": (
        "6fdff28b414be9fe",
        "f8617b744ece43e1",
        "b6c283536d824d8f",
        "bd8cddd49da1bfb5",
        "2a1ece00f5337397",
    ),
}

#: The releases both accelerate integrations serve (the library and its command line), and the
#: ones the release matrix runs.
RELEASES = ">=1.10,<1.17"
TESTED = {"oldest": "1.10.1", "middle": "1.13.0", "newest": "1.16.0"}

INTEGRATION = Integration(
    name="accelerate",
    distribution="accelerate",
    trigger="accelerate",
    releases=RELEASES,
    tested=TESTED,
    seams=[
        Seam(
            _MODELING,
            "get_max_memory",
            _get_max_memory,
            params=("max_memory",),
            importers=("accelerate.utils", "transformers.integrations.accelerate"),
            why="per-device memory of the registry's current backend (no ladder); given keys kept",
        ),
        Seam(
            "accelerate.utils.memory",
            "clear_device_cache",
            _clear_device_cache,
            params=("garbage_collection",),
            importers=("accelerate.hooks", "peft.utils.loftq_utils"),
            why="empty the cache of the current backend",
        ),
        Seam(
            "accelerate.big_modeling",
            "dispatch_model",
            _dispatch_model,
            params=("model", "device_map", "main_device"),
            importers=("accelerate", "accelerate.utils.bnb", "transformers.integrations.accelerate"),
            why="main_device = the map's first accelerator in forward order, not a hash-ordered set's",
        ),
        Seam(
            _MODELING,
            "set_module_tensor_to_device",
            _set_module_tensor_to_device,
            params=("module", "tensor_name", "device", "value", "dtype", "fp16_statistics"),
            importers=("accelerate.hooks", "accelerate.utils", "accelerate.utils.bnb"),
            why="qualified devices; bitsandbytes quantize-on-move on every accelerator its rules allow",
        ),
        Seam(
            "accelerate.state",
            "PartialState.default_device",
            _default_device,
            params=("self",),
            why="the registry's current backend, in accelerate's form",
        ),
        Seam(
            "accelerate.state",
            "PartialState._prepare_backend",
            why="a launched rank of any registry backend gets a multi-process type and dist_backend(); "
            "never a backend the registry would not choose",
            adapters=(
                Adapter(
                    RELEASES, _prepare_backend, shapes=_SHAPES["prepare_backend"], params=_PREPARE_PARAMS
                ),
            ),
        ),
        Seam(
            "accelerate.state",
            "PartialState.set_device",
            why="rank r on <backend>:r (the registry's resolve()); a launched rank silently on the cpu "
            "is a DeviceError",
            adapters=(Adapter(RELEASES, _set_device, shapes=_SHAPES["set_device"], params=("self",)),),
        ),
        Seam(
            "accelerate.checkpointing",
            "load_accelerator_state",
            _load_accelerator_state,
            params=("input_dir", "models", "map_location"),
            importers=("accelerate.accelerator",),
            why="load_state onto a registry device safetensors does not list (it knows a fixed set of "
            "device names): through the cpu",
        ),
    ],
    scan_prefixes=LIBRARIES,
)

#: The launcher's seams: the ``accelerate`` command (``launch``, ``config default``, ``env``),
#: enabled when ``accelerate.commands.launch`` is imported (the CLI imports every command), so a
#: training process that imports accelerate never loads the command modules.
LAUNCHER = Integration(
    name="accelerate_launch",
    distribution="accelerate",
    trigger="accelerate.commands.launch",
    releases=RELEASES,
    tested=TESTED,
    seams=[
        Seam(
            "accelerate.commands.launch",
            "_validate_launch_command",
            why="the process count and multi-process mode from the registry's devices (--gpu_ids: the "
            "devices it selects), where no config file decides",
            adapters=(
                Adapter(RELEASES, _validate_launch_command, shapes=_SHAPES["validate"], params=("args",)),
            ),
        ),
        *(
            Seam(
                "accelerate.utils.launch",
                name,
                _prepare_env,
                params=("args",),
                importers=("accelerate.commands.launch", "accelerate.utils"),
                why="--gpu_ids masks the registry backend's visible-devices variable",
            )
            for name in (
                "prepare_multi_gpu_env",
                "prepare_simple_launcher_cmd_env",
                "prepare_deepspeed_cmd_env",
            )
        ),
        Seam(
            "accelerate.commands.config.default",
            "write_basic_config",
            _write_basic_config,
            params=("mixed_precision", "save_location"),
            importers=("accelerate.commands.config", "accelerate.utils"),
            why="accelerate config default writes the registry backend's device count and process mode",
        ),
        Seam(
            "accelerate.commands.env",
            "env_command",
            _env_command,
            params=("args",),
            why="accelerate env shows the registry's backend",
        ),
    ],
    scan_prefixes=("accelerate",),
)


enable, disable, enabled = INTEGRATION.api()
