"""One rank of a DeepSpeed ZeRO run (started by torchrun): ZeRO stages in one interpreter.

    python -m torch.distributed.run --nproc-per-node N _zero.py --out DIR [--stages 0 1 2 3]

``accelreg.install()`` is the only accelreg line, as in a user's script. For each stage a tiny
Llama (same seed everywhere) goes to ``accelreg.resolve()`` (this rank's device), gets a torch
AdamW, and trains a few steps through ``deepspeed.initialize`` on data that depends only on the
rank and the step. Each rank writes one JSON file (``rank<R>.json``) with its losses, where its
parameters lived, DeepSpeed's accelerator and the collective backend, and the same training
done in plain torch on the cpu in this process (``cpu_reference``; one data-parallel step is a
step on the mean of the ranks' losses) — the losses on the emulated device must match it.

The model goes to its device *before* the optimizer is built: on a PrivateUse1 device without a
shallow-copy override, ``Module.to()`` replaces parameters instead of moving them, and
DeepSpeed would then hold the optimizer's stale cpu parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from typing import Any

warnings.filterwarnings("ignore")
T0 = time.time()

import accelreg  # noqa: E402

accelreg.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

STEPS = 3
VOCAB = 64


def config(stage: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:  # partition even the tiny model's parameters
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips at 1.0 unless told; the reference does not
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(cfg)


def batch(step: int, rank: int) -> Any:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 8), generator=gen)


def cpu_reference(world_size: int) -> list[list[float]]:
    """The same training in plain torch on the cpu: data parallelism over ``world_size`` ranks
    is one step on the mean of the ranks' losses. Returns each rank's losses."""
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    out: list[list[float]] = [[] for _ in range(world_size)]
    for step in range(STEPS):
        losses = [model(input_ids=batch(step, r), labels=batch(step, r)).loss for r in range(world_size)]
        optimizer.zero_grad()
        (sum(losses) / world_size).backward()
        optimizer.step()
        for r, loss in enumerate(losses):
            out[r].append(loss.item())
    return out


def train(stage: int, rank: int) -> dict[str, Any]:
    import deepspeed

    device = accelreg.resolve()
    model = tiny_llama().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config(stage))
    losses = []
    for step in range(STEPS):
        ids = batch(step, rank).to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    record = {
        "losses": losses,
        "engine_device": str(engine.device),
        "param_devices": sorted({str(p.device) for p in engine.module.parameters()}),
    }
    engine.destroy()
    return record


def collectives(rank: int, world: int) -> dict[str, Any]:
    """Each collective DeepSpeed uses, on tensors that live on this rank's device, through the
    process group DeepSpeed initialised with its accelerator's communication backend."""
    import deepspeed.comm as ds_comm

    dev = accelreg.resolve()

    def on(values: list[float]) -> Any:
        return torch.tensor(values, dtype=torch.float32, device=dev)

    out: dict[str, Any] = {}
    x = on([rank + 1.0] * 3)
    ds_comm.all_reduce(x)
    out["all_reduce"] = (x.tolist(), str(x.device))
    gathered = torch.empty(2 * world, device=dev)
    dist.all_gather_into_tensor(gathered, on([rank, rank]))
    out["all_gather_into_tensor"] = gathered.tolist()
    # DeepSpeed 0.18's ZeRO-1/2 gathers the updated weights into flat buffers that require grad:
    # a device runtime writes them outside autograd
    flat = torch.zeros(2 * world, device=dev, requires_grad=True)
    dist.all_gather_into_tensor(flat, on([rank, rank]))
    out["all_gather_into_grad_buffer"] = flat.tolist()
    parts = [torch.empty(1, device=dev) for _ in range(world)]
    dist.all_gather(parts, on([10.0 * rank]))
    out["all_gather"] = [p.item() for p in parts]
    mine = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(mine, on([float(i) for i in range(2 * world)]))
    out["reduce_scatter_tensor"] = mine.tolist()
    mine = torch.empty(1, device=dev)
    dist.reduce_scatter(mine, [on([r + 1.0]) for r in range(world)])
    out["reduce_scatter"] = mine.tolist()
    b = on([float(rank)] * 2)
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b.tolist()
    dist.barrier()
    out["barrier"] = True
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", nargs="*", type=int, default=[0, 1, 2, 3])
    a = ap.parse_args()
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    if accel.device_name() == "cpu":
        # DeepSpeed's own cpu class JIT-builds a shared-memory all-reduce (minutes on 2 cores)
        import importlib

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    rank = int(os.environ["RANK"])
    out: dict[str, Any] = {
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "backend": accelreg.current_backend().name,
        "resolved": str(accelreg.resolve()),
        "visible": accelreg.current_backend().visible_devices,
        "capacity": getattr(torch, accelreg.resolve().type).mem_get_info(accelreg.resolve().index)[1],
        "accelerator": type(accel).__name__,
        "accelerator_name": accel.device_name(),
        "accelerator_devices": accel.device_count(),
        "communication_backend": accel.communication_backend_name(),
        "dist_backend": accelreg.dist_backend(),
        "collectives": None,
        "stages": {},
        "cpu_reference": cpu_reference(int(os.environ["WORLD_SIZE"]))[rank],
    }
    import deepspeed

    deepspeed.init_distributed()  # with the accelerator's communication backend
    out["collectives"] = collectives(rank, out["world_size"])
    for stage in a.stages:
        try:
            out["stages"][str(stage)] = train(stage, rank)
        except Exception as exc:  # noqa: BLE001 - reported per stage
            import traceback

            out["stages"][str(stage)] = {"error": "".join(traceback.format_exception(exc))[-3000:]}
    out["process_group_backend"] = dist.get_backend() if dist.is_initialized() else None
    from accelreg.integrations.deepspeed import accelerator_report

    out["report"] = accelerator_report()
    out["seconds"] = round(time.time() - T0, 2)
    path = os.path.join(a.out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
