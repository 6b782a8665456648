"""Lightning's FSDP strategies on two emulated devices: ``python _lightning_fsdp.py OUT SPEC
ACCELERATOR [IMPORT_NAME]``.

Under ``accelreg.install()``, with ``accelerator=ACCELERATOR`` (``auto`` or the backend's name),
``devices=2`` and the strategy SPEC names (Lightning's subprocess launcher re-runs this script for
rank 1):

* ``fsdp``: ``strategy="fsdp"`` for the Trainer (its full state-dict checkpoint, one file) and
  for Fabric (its sharded checkpoint, a folder);
* ``FSDPStrategy``: ``FSDPStrategy(state_dict_type="sharded")`` for the Trainer and
  ``FSDPStrategy(state_dict_type="full")`` for Fabric;
* ``ModelParallelStrategy`` (FSDP2, Lightning 2.4+): ``fully_shard`` over a data-parallel mesh
  of both devices, the Trainer's distributed (sharded) checkpoint and Fabric's full one.

The Trainer trains a tiny model for one epoch (2 steps on each rank) and saves a checkpoint; a
second Trainer restores it (nothing more to train: its parameters must be the saved ones), a
third resumes it for a second epoch, a fourth trains two epochs straight, and a fifth one epoch
in ``bf16-mixed`` (autocast on the backend's device type). Then Fabric in the same two processes trains 2 steps, saves, perturbs its
parameters and loads them back. Each rank writes ``OUT/<part><rank>.json`` with the whole
model's parameters (gathered from the shards on every rank).
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

# appended, not first: tests/deepspeed would shadow the deepspeed package
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _lightning import QUIET, data, tiny  # noqa: E402

OUT, SPEC, ACCELERATOR = sys.argv[1], sys.argv[2], sys.argv[3]
L = importlib.import_module(sys.argv[4] if len(sys.argv) > 4 else "lightning")
FABRIC = importlib.import_module(
    "lightning_fabric" if L.__name__ == "pytorch_lightning" else "lightning.fabric"
)
Fabric = FABRIC.Fabric
STRATEGIES = importlib.import_module(
    "pytorch_lightning.strategies" if L.__name__ == "pytorch_lightning" else "lightning.pytorch.strategies"
)


def _write(name: str, record: dict) -> None:
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


def _full(module: torch.nn.Module) -> list[list[float]]:
    """The whole model's parameters on every rank, gathered from the shards (FSDP's root module
    or, under FSDP2, the module)."""
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return [v.detach().cpu().flatten().tolist() for v in state.values()]


def _parallelize(model: torch.nn.Module, mesh: object) -> torch.nn.Module:
    """FSDP2 over the data-parallel dimension of the strategy's device mesh."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    for layer in (model.a, model.b):
        fully_shard(layer, mesh=mesh["data_parallel"])
    fully_shard(model, mesh=mesh["data_parallel"])
    return model


class Batches(L.Callback):
    """The batches this rank trained on (for the same training on the cpu, in the test)."""

    def __init__(self) -> None:
        self.seen: list = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.seen.append([t.cpu().tolist() for t in batch])


#: SGD with momentum: Lightning's FSDP strategy cannot load the full checkpoint of an optimizer
#: that has no state (plain SGD: ``IndexError`` in ``FSDPStrategy.load_checkpoint``, on CUDA too).
MOMENTUM = 0.9


def _optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=MOMENTUM)


def _model() -> L.LightningModule:
    model = tiny(L)
    model.configure_optimizers = lambda: _optimizer(model.parameters())

    def autocast(_module: object, args: tuple) -> None:  # whether autocast is on for the input's device
        model.seen["autocast"] = torch.is_autocast_enabled(args[0].device.type)

    model.a.register_forward_pre_hook(autocast)
    if SPEC == "ModelParallelStrategy":  # the Trainer's FSDP2 hook: configure_model
        model.configure_model = lambda: _parallelize(model, model.device_mesh)
    return model


def _trainer_strategy() -> object:
    if SPEC == "fsdp":
        return "fsdp"
    if SPEC == "FSDPStrategy":
        return STRATEGIES.FSDPStrategy(state_dict_type="sharded")
    return STRATEGIES.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)


def _fabric_strategy() -> object:
    if SPEC == "fsdp":
        return "fsdp"
    if SPEC == "FSDPStrategy":
        return FABRIC.strategies.FSDPStrategy(state_dict_type="full")
    return FABRIC.strategies.ModelParallelStrategy(
        parallelize_fn=_parallelize,
        data_parallel_size=2,
        tensor_parallel_size=1,
        save_distributed_checkpoint=False,
    )


def _root(trainer: object) -> torch.nn.Module:
    return trainer.strategy.model


def _fit(epochs: int, ckpt: str | None = None, *callbacks: object, **kw: object) -> tuple[object, object]:
    model = _model()
    trainer = L.Trainer(
        accelerator=ACCELERATOR,
        devices=2,
        strategy=_trainer_strategy(),
        max_epochs=epochs,
        callbacks=list(callbacks),
        **QUIET,
        **kw,
    )
    trainer.fit(model, data(), ckpt_path=ckpt)
    return trainer, model


def trainer_part() -> None:
    first, _ = _fit(1)
    saved = _full(_root(first))
    ckpt = os.path.join(OUT, "epoch1.ckpt")
    first.save_checkpoint(ckpt)
    restored, _ = _fit(1, ckpt)
    resumed, _ = _fit(2, ckpt)
    resumed_params = _full(_root(resumed))
    batches = Batches()
    straight, straight_model = _fit(2, None, batches)
    strategy = straight.strategy
    _, mixed_model = _fit(1, None, precision="bf16-mixed")
    _write(
        f"trainer{straight.global_rank}.json",
        {
            "rank": straight.global_rank,
            "strategy": type(strategy).__name__,
            "accelerator": type(strategy.accelerator).__name__,
            "root_device": str(strategy.root_device),
            "input": str(straight_model.seen["input"]),
            "weight": str(straight_model.seen["weight"]),
            "local_devices": sorted({str(p.device) for p in _root(straight).parameters()}),
            "backend": dist.get_backend(),
            "accelreg_backend": accelreg.dist_backend(),
            "saved_step": first.global_step,
            "restored_equal": _full(_root(restored)) == saved,
            "resumed_step": resumed.global_step,
            "resumed_params": resumed_params,
            "params": _full(_root(straight)),
            "checkpoint_is_dir": os.path.isdir(ckpt),
            "batches": batches.seen,
            "mixed_matmul": str(mixed_model.seen["matmul"]),
            "mixed_input": str(mixed_model.seen["input"]),
            "mixed_autocast": mixed_model.seen["autocast"],
            "autocast": straight_model.seen["autocast"],
        },
    )


def fabric_part() -> None:
    fabric = Fabric(accelerator=ACCELERATOR, devices=2, strategy=_fabric_strategy())
    fabric.launch()  # the processes exist: Fabric joins them
    model = fabric.setup_module(tiny(L))
    optimizer = fabric.setup_optimizers(_optimizer(model.parameters()))
    for step, (x, y) in enumerate(data()):
        if step == 2:
            break
        loss = torch.nn.functional.mse_loss(model(fabric.to_device(x)), fabric.to_device(y))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    root = model._forward_module
    saved = _full(root)
    path = os.path.join(OUT, "fabric.ckpt")
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 2})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    perturbed = _full(root) != saved
    remainder = fabric.load(path, {"model": model, "optimizer": optimizer})
    _write(
        f"fabric{fabric.global_rank}.json",
        {
            "rank": fabric.global_rank,
            "strategy": type(fabric.strategy).__name__,
            "device": str(fabric.device),
            "local_devices": sorted({str(p.device) for p in root.parameters()}),
            "backend": dist.get_backend(),
            "loss": float(loss),
            "perturbed": perturbed,
            "restored_equal": _full(root) == saved,
            "remainder": remainder,
            "checkpoint_is_dir": os.path.isdir(path),
        },
    )


if __name__ == "__main__":
    trainer_part()
    fabric_part()
