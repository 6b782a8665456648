"""Two ranks that Lightning launches itself: ``python _lightning_ddp.py OUT STRATEGY``.

Under ``accelreg.install()``, ``Trainer(accelerator="auto", devices=2, strategy=STRATEGY)`` trains
a tiny model; Lightning starts the second process (``ddp``: its subprocess launcher re-runs this
script; ``ddp_spawn``: multiprocessing). Each rank writes what it ran on, and the batches it trained on, to
``OUT/trainer<rank>.json``. With ``ddp``, the same two processes then run Fabric
(``Fabric(devices=2, strategy="ddp")``, which finds the processes launched) and write each rank's
device and collective results to ``OUT/fabric<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import accelreg

accelreg.install()

import lightning as L  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _lightning import QUIET, data, params, tiny  # noqa: E402

OUT, STRATEGY = sys.argv[1], sys.argv[2]
STEPS = 2


def _write(name: str, record: dict) -> None:
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


class Record(L.Callback):
    """Writes each rank's record where the training ran (a spawned rank's model is a copy),
    with the batches it trained on (for the same training on the cpu, in the test)."""

    def __init__(self) -> None:
        self.batches: list = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches.append([t.cpu().tolist() for t in batch])

    def on_train_end(self, trainer, module) -> None:
        loss = trainer.strategy.reduce(
            torch.tensor(module.seen["loss"], device=module.device), reduce_op="mean"
        )
        _write(
            f"trainer{trainer.global_rank}.json",
            {
                "rank": trainer.global_rank,
                "root_device": str(trainer.strategy.root_device),
                "input": str(module.seen["input"]),
                "weight": str(module.seen["weight"]),
                "backend": dist.get_backend(),
                "accelreg_backend": accelreg.dist_backend(),
                "params": [p.flatten().tolist() for p in params(module)],
                "loss": float(loss),
                "batches": self.batches,
            },
        )


def fabric_part() -> None:
    fabric = L.Fabric(accelerator="auto", devices=2, strategy="ddp")
    fabric.launch()  # the processes exist: Fabric joins them
    rank, device = fabric.global_rank, fabric.device
    total = fabric.all_reduce(torch.tensor(float(rank + 1), device=device), reduce_op="sum")
    gathered = fabric.all_gather(torch.tensor([rank * 10], device=device))
    sent = fabric.broadcast(torch.tensor([7.0 if rank == 0 else -1.0], device=device), src=0)
    _write(
        f"fabric{rank}.json",
        {
            "rank": rank,
            "device": str(device),
            "all_reduce": float(total),
            "all_reduce_device": str(total.device),
            "all_gather": gathered.flatten().tolist(),
            "broadcast": sent.tolist(),
            "backend": dist.get_backend(),
        },
    )


def main() -> None:
    trainer = L.Trainer(
        accelerator="auto", devices=2, strategy=STRATEGY, max_steps=STEPS, callbacks=[Record()], **QUIET
    )
    trainer.fit(tiny(L), data())
    if STRATEGY == "ddp":
        fabric_part()


if __name__ == "__main__":
    main()
