"""One torchrun rank: resolve this rank's device, allocate on it, all-reduce a tensor on it over
the collective backend the plugin declares (``accelreg.dist_backend()``, the process group bound
to the device), and report what
accelreg, the emulated runtime and DeepSpeed (handed its accelerator by ``accelreg.install()``)
each say: one JSON file per rank in $RANK_RESULTS, since two ranks printing to one pipe can
interleave their lines."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

import accelreg

accelreg.install()
device = accelreg.resolve()
# bound to the device, as Lightning 2.6 and accelerate do: the backend must serve the device type
dist.init_process_group(accelreg.dist_backend(), device_id=device)
rank = dist.get_rank()
runtime = getattr(torch, device.type)
x = torch.full((1024,), float(rank + 1), device=device)
total = x.sum().reshape(1)
dist.all_reduce(total)  # on the device, through the emulator's collective backend

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
        "all_reduce_device": str(total.device),
        "dist_backend": dist.get_backend(),
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
