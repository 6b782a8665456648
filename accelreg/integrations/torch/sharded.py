"""The torch_sharded_tensor row: torch's ``ShardedTensor`` on the devices of a registry backend.

FSDP's sharded state dicts hold ``ShardedTensor`` values (Lightning's
``FSDPStrategy(state_dict_type="sharded")``, Fabric's FSDP default, accelerate's
``SHARDED_STATE_DICT``), and ``torch.distributed.checkpoint`` asks each one for its ``device``
when it loads them back. For a rank that holds no piece of a tensor (a small bias sharded over
two ranks), torch 2.13 answers the cpu under gloo and ``torch.cuda.current_device()`` under any
other collective backend: on every accelerator but CUDA, loading a sharded FSDP checkpoint
raises "Torch not compiled with CUDA enabled". Seam: ``ShardedTensor.__torch_function__``, for
that one question only: where the tensor's process group runs a registry backend's collectives
(``accelreg.dist_backend``), the device is that backend's device of this process
(``accelreg.resolve()``); everything else is torch's. Enabled when
``torch.distributed._shard.sharded_tensor`` is first imported (FSDP's state-dict code and
``torch.distributed.checkpoint`` import it), so no other process pays for it.
"""

from __future__ import annotations

import functools
from typing import Any

from ... import registry
from ...resolution import current_in_use, resolve
from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam

__all__ = ["INTEGRATION", "RELEASES", "ROW", "disable", "enable", "enabled"]

ROW = table.row("torch_sharded_tensor")
#: The torch releases this integration was verified with: the one every release set runs.
RELEASES = ROW.releases

#: Shapes of ``ShardedTensor.__torch_function__`` (torch 2.13).
_SHAPES = ("b259a2cfa8c6c864",)


def _registry_device(group: Any) -> Any:
    """The registry's device for this process when ``group`` (``None``: the default group) runs
    the collectives of the registry's current backend; else ``None``."""
    import torch.distributed as dist

    try:
        collectives = dist.get_backend(group)
    except (RuntimeError, ValueError):
        return None  # no process group: torch's own answer
    chosen = current_in_use(registry.get())
    from ...queries import dist_backend  # at first use, not in install()

    if chosen.name == "cpu" or dist_backend(chosen.name) != collectives:
        return None
    return resolve()


def _torch_function(original: Any) -> Any:
    @functools.wraps(original)
    def __torch_function__(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch

        # a method-wrapper made anew at each access: equal, never identical (torch's table
        # of ShardedTensor operations finds it by equality too)
        if func == torch.Tensor.device.__get__ and args and not getattr(args[0], "_local_shards", True):
            device = _registry_device(getattr(args[0], "_process_group", None))
            if device is not None:
                return device
        return original(cls, func, types, args, kwargs)

    return __torch_function__


INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "torch.distributed._shard.sharded_tensor.api",
            "ShardedTensor.__torch_function__",
            why="the device of a ShardedTensor piece a rank does not hold is the registry backend's "
            "device of the process, not torch.cuda's (FSDP sharded checkpoints load off CUDA)",
            adapters=(Adapter(RELEASES, _torch_function, shapes=_SHAPES),),
        ),
    ],
    scan_prefixes=("torch.distributed._shard",),
)

enable, disable, enabled = INTEGRATION.api()
