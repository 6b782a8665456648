"""Lightning's DeepSpeed strategies on two emulated devices: ``python _lightning_deepspeed.py OUT
STRATEGY [IMPORT_NAME]``.

Under ``accelreg.install()``, ``Trainer(accelerator="auto", devices=2, strategy=STRATEGY)``
(``deepspeed_stage_2``, ``deepspeed_stage_3``, ...; Lightning's subprocess launcher re-runs this
script for rank 1) trains a tiny model for one epoch (2 steps on each rank), saves a checkpoint,
a second Trainer restores it (nothing more to train: the parameters must be the saved ones), a
third resumes it for a second epoch, and a fourth trains two epochs straight. Then Fabric in the same two
processes (``Fabric(devices=2, strategy=STRATEGY)``, ``setup(model, optimizer)`` with the
optimizer built first) trains 2 steps. Each rank writes ``OUT/<part><rank>.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

import accelreg

accelreg.install()

import torch.distributed as dist  # noqa: E402

# appended, not first: tests/deepspeed would shadow the deepspeed package
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _lightning import QUIET, data, params, tiny  # noqa: E402

OUT, STRATEGY = sys.argv[1], sys.argv[2]
L = importlib.import_module(sys.argv[3] if len(sys.argv) > 3 else "lightning")
Fabric = importlib.import_module("lightning_fabric").Fabric if L.__name__ == "pytorch_lightning" else L.Fabric


def _write(name: str, record: dict) -> None:
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


def _flat(module: torch.nn.Module, strategy: object) -> list[list[float]]:
    """The full parameters on every rank (ZeRO-3 shards them: gathered first)."""
    if "stage_3" in STRATEGY or getattr(strategy, "zero_stage_3", False):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            return [p.detach().flatten().cpu().tolist() for p in module.parameters()]
    return [p.flatten().tolist() for p in params(module)]


class Batches(L.Callback):
    """The batches this rank trained on (for the same training on the cpu, in the test)."""

    def __init__(self) -> None:
        self.seen: list = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.seen.append([t.cpu().tolist() for t in batch])


def _fit(epochs: int, ckpt: str | None = None, *callbacks: object) -> tuple[object, object]:
    model = tiny(L)
    trainer = L.Trainer(
        accelerator="auto",
        devices=2,
        strategy=STRATEGY,
        max_epochs=epochs,
        callbacks=list(callbacks),
        **QUIET,
    )
    trainer.fit(model, data(), ckpt_path=ckpt)
    return trainer, model


def trainer_part() -> None:
    first, first_model = _fit(1)
    saved = _flat(first_model, first.strategy)
    ckpt = os.path.join(OUT, "epoch1.ckpt")
    first.save_checkpoint(ckpt)
    restored, restored_model = _fit(1, ckpt)
    resumed, model = _fit(2, ckpt)
    resumed_params = _flat(model, resumed.strategy)
    batches = Batches()
    straight, straight_model = _fit(2, None, batches)
    strategy = straight.strategy
    _write(
        f"trainer{straight.global_rank}.json",
        {
            "rank": straight.global_rank,
            "strategy": type(strategy).__name__,
            "zero_stage": strategy.config["zero_optimization"]["stage"],
            "root_device": str(strategy.root_device),
            "input": str(straight_model.seen["input"]),
            "engine_device": str(strategy.model.device),
            "backend": dist.get_backend(),
            "accelreg_backend": accelreg.dist_backend(),
            "saved_step": first.global_step,
            "restored_equal": _flat(restored_model, restored.strategy) == saved,
            "resumed_step": resumed.global_step,
            "resumed_params": resumed_params,
            "params": _flat(straight_model, strategy),
            "checkpoint_is_dir": os.path.isdir(ckpt),
            "batches": batches.seen,
        },
    )


def fabric_part() -> None:
    fabric = Fabric(accelerator="auto", devices=2, strategy=STRATEGY)
    fabric.launch()  # the processes exist: Fabric joins them
    model = tiny(L)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built before the model moves
    model, optimizer = fabric.setup(model, optimizer)
    for step, (x, y) in enumerate(data()):
        if step == 2:
            break
        loss = torch.nn.functional.mse_loss(model(fabric.to_device(x)), fabric.to_device(y))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    _write(
        f"fabric{fabric.global_rank}.json",
        {
            "rank": fabric.global_rank,
            "device": str(fabric.device),
            "engine_device": str(model._forward_module.device) if hasattr(model, "_forward_module") else None,
            "backend": dist.get_backend(),
            "loss": float(loss),
        },
    )


if __name__ == "__main__":
    trainer_part()
    fabric_part()
