"""The accelerate_launch row: accelerate's command line under the registry.

``accelerate launch`` counts, selects and masks the registry backend's devices, ``accelerate
config default`` writes them, and ``accelerate env`` shows the registry's backend. Enabled under
``install()`` when ``accelerate.commands.launch`` is imported — in the ``accelerate`` command's
own process, never in a training process.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from ... import registry
from ...errors import DeviceError
from ...resolution import current_in_use
from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam
from .._machinery.slots import slots_under_mask
from .integration import _SHAPES, RELEASES
from .state import _distributed_type

__all__ = ["INTEGRATION", "LAUNCHER", "disable", "enable", "enabled"]

log = logging.getLogger("accelreg.integrations.accelerate")


# -- the launcher: accelerate launch / accelerate config default / accelerate env ---------------
def _validate_launch_command(original: Any) -> Any:
    @functools.wraps(original)
    def _validate_launch_command(args: Any) -> Any:
        given = (args.num_processes, args.multi_gpu)
        out = original(args)  # its checks of the flags the user gave, then the config file's modes
        defaults = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if defaults is None and not args.cpu and not getattr(args, "tpu", False):
            _count_registry_devices(args, *given)  # (a TPU is not the registry's: accelerate's count)
        return out

    return _validate_launch_command


def _gpu_ids(args: Any) -> list[str] | None:
    ids = getattr(args, "gpu_ids", None)
    if ids is None or str(ids).strip() in ("", "all"):
        return None
    return [i.strip() for i in str(ids).split(",") if i.strip()]


def _count_registry_devices(args: Any, num_processes: int | None, multi_gpu: bool) -> None:
    """Redo, with the registry's devices, the two decisions accelerate's launcher makes from its
    own device ladder where no config file decides, after its checks of the flags given (so
    ``--use_deepspeed``, ``--use_fsdp``, ``--multi_gpu``, ``--cpu`` are checked as the user typed
    them): the process count, unless ``--num_processes`` was given (the devices ``--gpu_ids``
    selects, else every device of the current backend), and multi-process mode, unless
    ``--multi_gpu`` was given (more than one process and more than one device on this machine).
    As upstream, that mode is also set beside ``--use_deepspeed``/``--use_fsdp`` (their launchers
    come first); ``--cpu`` and ``--tpu`` are not touched (the caller skips them)."""
    chosen = current_in_use(registry.get())
    if chosen.name == "cpu":
        return  # accelerate's own answer stands (a backend accelreg has disabled: see set_device)
    ids = _gpu_ids(args)
    if num_processes is None:
        count = max(len(ids) if ids is not None else chosen.count, 1)
        if args.num_processes != count:  # accelerate said its own count just now
            log.warning(
                "accelreg: `--num_processes` is %d, the %s devices %s (not accelerate's count, %s)",
                count,
                chosen.name,
                "--gpu_ids selects" if ids is not None else "the registry counts",
                args.num_processes,
            )
        args.num_processes = count
    if not multi_gpu:
        args.multi_gpu = args.num_processes > 1 and chosen.count > 1


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


#: The launcher's seams: the ``accelerate`` command (``launch``, ``config default``, ``env``),
#: enabled when ``accelerate.commands.launch`` is imported (the CLI imports every command), so a
#: training process that imports accelerate never loads the command modules.
LAUNCHER = Integration(
    **table.row("accelerate_launch").declared(),
    seams=[
        Seam(
            "accelerate.commands.launch",
            "_validate_launch_command",
            why="the process count and multi-process mode from the registry's devices (--gpu_ids: the "
            "devices it selects), where no config file decides, after accelerate's checks of the "
            "mode flags given",
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


INTEGRATION = LAUNCHER

enable, disable, enabled = INTEGRATION.api()
