"""What a rank puts its work on when the user disabled the (emulated) npu in accelreg:
``python _disabled_rank.py OUT MODE``; MODE ``torchrun`` / ``deepspeed`` (a rank of that launcher)
or ``lightning`` (Fabric's own launcher starts the second process).

No accelreg line: the job runs under ``accelreg run``. Each rank asks every host library that
picks a device by itself — torch.accelerator, accelreg, accelerate's ``PartialState``
(torchrun only: it joins the ranks' process group), DeepSpeed's accelerator, Lightning's
``accelerator="auto"``, and the Ray resource a node would offer for NPU — and writes the answers
to ``OUT/rank<rank>.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import torch
from deepspeed.accelerator import get_accelerator

import accelreg

OUT, MODE = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # DeepSpeed's launcher adds it


def _ray_npu() -> int:
    """NPUs this node would offer Ray (the manager Ray uses for the resource, accelreg's or its own)."""
    from ray._private import accelerators

    manager = accelerators.get_accelerator_manager_for_resource("NPU")
    return int(manager.get_current_node_num_accelerators()) if manager is not None else 0


def record(rank: int, **extra: object) -> None:
    out = {
        "rank": rank,
        "runtime_present": importlib.util.find_spec("torch_npu") is not None,
        "torch_accelerator": str(torch.accelerator.current_accelerator()),
        "torch_device_count": torch.accelerator.device_count(),
        "resolve": str(accelreg.resolve()),
        "deepspeed": get_accelerator().device_name(),
        "ray_npu": _ray_npu(),
        "npu_mask": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
        "cuda_mask": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **extra,
    }
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


def main() -> None:
    import lightning as L

    if MODE == "lightning":
        fabric = L.Fabric(accelerator="auto", devices=2, strategy="ddp")
        fabric.launch()
        record(fabric.global_rank, lightning=type(fabric.accelerator).__name__, device=str(fabric.device))
        return
    trainer = L.Trainer(accelerator="auto", devices=2, strategy="ddp", logger=False)
    extra = {"lightning": type(trainer.accelerator).__name__, "device": str(trainer.strategy.root_device)}
    if MODE == "torchrun":
        from accelerate import PartialState

        state = PartialState()
        extra.update(accelerate=str(state.device), accelerate_type=str(state.distributed_type).split(".")[-1])
    record(int(os.environ["RANK"]), **extra)


if __name__ == "__main__":
    main()
