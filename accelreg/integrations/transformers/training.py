"""The ``transformers_training`` row (trigger ``transformers.training_args``): ``TrainingArguments``'
device and mixed precision ask the registry.

The device: in one process (accelerate's ``DistributedType.NO``), the
registry's backend, with ``n_gpu`` 1 as transformers gives every accelerator it knows.

transformers' ``TrainingArguments._setup_devices`` (a ``cached_property``) asks accelerate's
``PartialState`` and then, for a single process, walks its own list of device types (mps, xpu,
mlu, musa, npu, hpu, neuron, tpu; else ``cuda:0`` or the cpu): a device type outside the list
becomes the cpu, ``n_gpu`` 0, and the Trainer then feeds a model that accelerate put on the
device with batches on the cpu. The replacement keeps transformers' own answer where it is the
registry's (npu on an npu node: its own branch, untouched) and otherwise gives the registry's
backend in the form transformers gives the ones it knows: ``<type>:0``, made current, ``n_gpu``
1. A launched rank (accelerate's multi-process types) keeps ``PartialState``'s device, which
accelreg's accelerate integration already answers; the cpu asked for (``use_cpu``,
``ACCELERATE_USE_CPU``, ``ACCELERATE_TORCH_DEVICE``) is left alone.

Mixed precision: ``TrainingArguments(bf16=True)`` asks ``is_torch_bf16_gpu_available()``, and
transformers' fp16/bf16 checks of a device are answered by the registry's capability query
(:mod:`.precision`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ... import registry
from ...resolution import current_in_use, resolve
from .._machinery import table
from .._machinery.seams import LIBRARIES, Adapter, Integration, Seam
from .precision import bf16_gpu_available, on_device

__all__ = ["INTEGRATION", "disable", "enable", "enabled", "setup_devices"]

_IMPORTS = "transformers.utils.import_utils"
#: Shapes of ``TrainingArguments._setup_devices`` (read from every release in the window).
_SETUP_DEVICES_457 = ("8d929a30d0b656d2",)
_SETUP_DEVICES_5 = (
    "16b8b90ab9865fe4",  # 5.0-5.3
    "250f469c6fcf010f",  # 5.4-5.8
    "f2eb7ac16f553dba",  # 5.9-5.14
    "c7cc861cc08eafb1",  # 5.15-5.19
    "c04fe1edcee0cc6f",  # 5.20-5.25
)


def _asks_for_the_cpu_or_a_device(args: Any, strtobool: Any) -> bool:
    """Whether the user chose the device: ``use_cpu``, or accelerate's variables (read as
    ``_setup_devices`` reads them: ``ACCELERATE_USE_CPU`` with transformers' ``strtobool``)."""
    if getattr(args, "use_cpu", False) or os.environ.get("ACCELERATE_TORCH_DEVICE"):
        return True
    try:
        return bool(strtobool(os.environ.get("ACCELERATE_USE_CPU", "False")))
    except ValueError:  # transformers' own call raised already; not a request for the cpu
        return False


def _registry_device(args: Any, theirs: Any, names: dict[str, Any]) -> Any:
    """The device for a single-process ``args`` whose ``_setup_devices`` answered ``theirs``
    (``names``: the globals of transformers' ``training_args``)."""
    import torch

    state = getattr(args, "distributed_state", None)
    if (
        state is None
        or state.distributed_type != names["DistributedType"].NO
        or _asks_for_the_cpu_or_a_device(args, names["strtobool"])
    ):
        return theirs
    current = current_in_use(registry.get())
    if current.name == "cpu":
        if theirs.type != "cpu" and any(b.device_type == theirs.type for b in registry.get().order):
            # transformers' list found a backend the registry would not choose (disabled, masked)
            args._n_gpu = 0
            return torch.device("cpu")
        return theirs
    if theirs.type == current.device_type:
        return theirs  # transformers knows this backend: its own branch stands
    device = resolve(0)
    module = getattr(torch, device.type, None)
    if device.index is not None and callable(getattr(module, "set_device", None)):
        module.set_device(device)
    args._n_gpu = 1
    return device


def setup_devices(original: Any) -> Any:
    """The replacement of ``TrainingArguments._setup_devices`` (``original``, a
    ``functools.cached_property``)."""
    func = original.func

    @functools.wraps(func)
    def _setup_devices(self: Any) -> Any:
        return _registry_device(self, func(self), func.__globals__)

    replacement = functools.cached_property(_setup_devices)
    replacement.__set_name__(None, original.attrname)
    return replacement


ROW = table.row("transformers_training")
_V4, _V5 = "~=4.57.0", ">=5.0,<5.26"

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "transformers.training_args",
            "TrainingArguments._setup_devices",
            why="one process trains on the registry's backend (<type>:0, n_gpu 1), not on the cpu where "
            "transformers' list of device types has no branch for it",
            adapters=(
                Adapter(_V4, setup_devices, shapes=_SETUP_DEVICES_457, params=("self",)),
                Adapter(_V5, setup_devices, shapes=_SETUP_DEVICES_5, params=("self",)),
            ),
            instead="pass the device yourself: build the Trainer's model on accelreg.resolve() and run under "
            "`accelreg run -- torchrun --nproc-per-node 1 ...` (a launched rank's device is accelerate's, "
            "which the accelerate integration answers)",
        ),
        Seam(
            _IMPORTS,
            "is_torch_bf16_gpu_available",
            bf16_gpu_available,
            why="TrainingArguments(bf16=True) on an accelerator the registry says computes in bfloat16",
            instead="check accelreg.capabilities().supports(torch.bfloat16) yourself; transformers refuses "
            "bf16=True on a device type outside its list",
        ),
        Seam(
            _IMPORTS,
            "is_torch_fp16_available_on_device",
            on_device("float16"),
            params=("device",),
            why="float16 on a registry device answered by accelreg.capabilities()",
        ),
        Seam(
            _IMPORTS,
            "is_torch_bf16_available_on_device",
            on_device("bfloat16"),
            params=("device",),
            why="bfloat16 on a registry device answered by accelreg.capabilities()",
        ),
    ],
    scan_prefixes=LIBRARIES,
)

enable, disable, enabled = INTEGRATION.api()
