"""One rank of a job started by DeepSpeed's own launcher (``deepspeed``) under ``accelreg run``.

    accelreg run [--devices ...] -- deepspeed [launcher options] _launch_rank.py --out DIR [--train]

There is no accelreg line here: the start-up hook of ``accelreg run`` installs the integrations
when this script imports DeepSpeed, as it did in DeepSpeed's runner and ``launch`` processes
that started this rank. The device is DeepSpeed's choice (its accelerator's device for
``LOCAL_RANK``). Each rank writes ``rank<R>.json``: what the launcher gave it (ranks, the mask
variables), DeepSpeed's accelerator, the device and its capacity (emulated devices have distinct
sizes, so the capacity says which physical device it is), what accelreg resolves, and with
``--train`` a few ZeRO-2 steps of a tiny model (same initial weights on every rank, data that
depends on the rank) with a checksum of the final weights: data parallelism ends equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import deepspeed  # noqa: E402 - the start-up hook hands DeepSpeed the registry's accelerator here
import torch  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

STEPS = 3


def train(device: torch.device, rank: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        # small buckets: the default (5e8 elements) would not fit the emulated devices' 1-2 GiB
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 10**6, "allgather_bucket_size": 10**6},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    losses = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(4, 8, generator=gen).to(engine.device)
        y = torch.randn(4, 4, generator=gen).to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().to("cpu").reshape(-1) for p in engine.module.parameters()])
    record = {
        "losses": losses,
        "engine_device": str(engine.device),
        "param_devices": sorted({str(p.device) for p in engine.module.parameters()}),
        "weights_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "weights_changed": bool(abs(float(flat.sum())) > 0),
    }
    engine.destroy()
    return record


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--local_rank", type=int, default=None)  # DeepSpeed's launcher passes it
    a = ap.parse_args()
    import accelreg  # only to report what the registry says; installed by the start-up hook
    from accelreg.integrations import status
    from accelreg.integrations.deepspeed import accelerator_report

    accel = get_accelerator()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = accelreg.current_backend()
    var = backend.visible_devices_var
    device = torch.device(accel.device_name(local_rank))
    module = getattr(torch, device.type)
    out: dict[str, object] = {
        "rank": rank,
        "local_rank": local_rank,
        "local_rank_argument": a.local_rank,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "mask_variable": var,
        "mask": os.environ.get(var) if var else None,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ACCELREG_RUN": os.environ.get("ACCELREG_RUN"),
        "integrations": {item["name"]: item["enabled"] for item in status()},
        "accelerator": type(accel).__name__,
        "accelerator_name": accel.device_name(),
        "accelerator_devices": accel.device_count(),
        "communication_backend": accel.communication_backend_name(),
        "report": accelerator_report()["how"],
        "device": str(device),
        "resolved": str(accelreg.resolve()),
        "capacity": int(module.mem_get_info(device.index)[1]),
    }
    if a.train:
        deepspeed.init_distributed()
        out["train"] = train(device, rank)
        out["process_group_backend"] = torch.distributed.get_backend()
    path = os.path.join(a.out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
