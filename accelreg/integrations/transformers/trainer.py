"""The ``transformers_trainer`` row (trigger ``transformers.trainer``): the Trainer's checkpoints keep the random state of the device it trains on, under the device
type's own key, and a resumed run restores it.

``Trainer._save_rng_state`` saves the python, numpy and cpu generators and those of the device
types in its list (cuda, xla, npu, hpu, mlu, musa); ``_load_rng_state`` restores the same list.
On any other device a resumed run does not continue the random stream it would have had. The
replacements run transformers' own first, then, when the Trainer's device (``args.device``) is a
registry accelerator whose type transformers left out, add that generator's state to the same
file (``rng_state.pth``, ``rng_state_<process>.pth`` with several processes), as
``get_rng_state_all()`` for a distributed run and ``get_rng_state()`` otherwise, exactly as
transformers keeps ``"npu"``; and restore it with transformers' own ``set_rng_state_for_device``.
A checkpoint without the entry (written elsewhere) is resumed as transformers resumes it.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any

from .._machinery import table
from .._machinery.precision import registry_device_type
from .._machinery.seams import LIBRARIES, Adapter, Integration, Seam

__all__ = ["INTEGRATION", "disable", "enable", "enabled", "load_rng_state", "save_rng_state"]

#: Shapes of the Trainer's random-state functions (read from every release in the window).
_SAVE = ("ea6350ecef0a222c",)  # 4.57-5.25
_LOAD_457, _LOAD_5 = ("9d9675528fab87a6",), ("7e93b94b863d1f6e",)


def _rng_file(args: Any, folder: str) -> str:
    """The file transformers writes this process's random states to."""
    name = "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
    return os.path.join(folder, name)


def _device_module(args: Any) -> tuple[str, Any] | None:
    """``(device type, torch.<device type>)`` of the Trainer's device when it is a registry
    accelerator's with random-state functions, else ``None``."""
    import torch

    kind = registry_device_type(args.device)
    module = getattr(torch, kind, None) if kind is not None else None
    if module is None or not callable(getattr(module, "get_rng_state", None)):
        return None
    return kind, module


def _distributed(args: Any, names: dict[str, Any]) -> bool:
    return bool(args.parallel_mode == names["ParallelMode"].DISTRIBUTED)


def save_rng_state(original: Any) -> Any:
    """The replacement of ``Trainer._save_rng_state``."""
    names = original.__globals__

    @functools.wraps(original)
    def _save_rng_state(self: Any, output_dir: str) -> None:
        original(self, output_dir)
        found = _device_module(self.args)
        path = _rng_file(self.args, output_dir)
        if found is None or not os.path.isfile(path):
            return
        kind, module = found
        import torch

        with names["safe_globals"]():
            states = torch.load(path, weights_only=True)
        if kind in states:
            return  # transformers keeps this device type itself
        if _distributed(self.args, names) and callable(getattr(module, "get_rng_state_all", None)):
            states[kind] = module.get_rng_state_all()
        else:
            states[kind] = module.get_rng_state()
        torch.save(states, path)

    return _save_rng_state


def load_rng_state(original: Any) -> Any:
    """The replacement of ``Trainer._load_rng_state``."""
    names = original.__globals__

    @functools.wraps(original)
    def _load_rng_state(self: Any, checkpoint: str | None) -> None:
        original(self, checkpoint)
        if checkpoint is None:
            return
        found = _device_module(self.args)
        path = _rng_file(self.args, checkpoint)
        if found is None or not os.path.isfile(path):
            return
        kind, module = found
        import torch

        with names["safe_globals"]():
            states = torch.load(path, weights_only=True)
        if kind not in states:
            return
        # transformers' own helper (its log line when a state does not fit), which reads
        # ``<module>.random``; restored again where transformers restored it already: the same state
        holder = module if hasattr(module, "random") else types.SimpleNamespace(random=module)
        names["set_rng_state_for_device"](kind.upper(), holder, states, _distributed(self.args, names))

    return _load_rng_state


ROW = table.row("transformers_trainer")
_V4, _V5 = "~=4.57.0", ">=5.0,<5.26"
_LOST = "a checkpoint keeps and restores the random state of the device type the Trainer runs on"

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "transformers.trainer",
            "Trainer._save_rng_state",
            why=_LOST,
            adapters=(Adapter(ROW.releases, save_rng_state, shapes=_SAVE, params=("self", "output_dir")),),
            instead="save torch.<device type>.get_rng_state() with your checkpoints yourself (a TrainerCallback)",
        ),
        Seam(
            "transformers.trainer",
            "Trainer._load_rng_state",
            why=_LOST,
            adapters=(
                Adapter(_V4, load_rng_state, shapes=_LOAD_457, params=("self", "checkpoint")),
                Adapter(_V5, load_rng_state, shapes=_LOAD_5, params=("self", "checkpoint")),
            ),
            instead="restore torch.<device type>.set_rng_state(...) when you resume, yourself",
        ),
    ],
    scan_prefixes=LIBRARIES,
)

enable, disable, enabled = INTEGRATION.api()
