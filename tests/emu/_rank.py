"""One torchrun rank: resolve this rank's device, allocate on it, all-reduce over gloo, and
report what accelreg, the emulated runtime and DeepSpeed each say: one JSON file per rank in
$RANK_RESULTS, since two ranks printing to one pipe can interleave their lines."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

import accelreg

dist.init_process_group("gloo")
rank = dist.get_rank()
device = accelreg.resolve()
runtime = getattr(torch, device.type)
x = torch.full((1024,), float(rank + 1), device=device)
total = torch.tensor([float(x.sum().item())])
dist.all_reduce(total)

from deepspeed.accelerator import get_accelerator  # noqa: E402 - after the runtime is up

ds = get_accelerator()
info = {b.name: b for b in accelreg.backends()}[accelreg.current_backend().name]
record = json.dumps(
    {
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "device": str(device),
        "capacity": runtime.mem_get_info(device.index)[1],
        "allocated": runtime.memory_allocated(device.index),
        "all_reduce": total.item(),
        "deepspeed": ds._name,
        "deepspeed_device": ds.device_name(int(os.environ["LOCAL_RANK"])),
        "visible": info.visible_devices,
    }
)
out = os.path.join(os.environ["RANK_RESULTS"], f"rank{rank}.json")
with open(out + ".tmp", "w") as f:
    f.write(record)
os.replace(out + ".tmp", out)  # the test never reads half a file
dist.destroy_process_group()
