"""One task of a Slurm step (or a rank a launcher started inside one): which device it runs on.

``python _probe.py MODE``, with ``PROBE_RESULTS`` a folder; one JSON file per task there (two
tasks printing to one pipe can interleave). MODE:

* ``plain`` — no accelreg and no Slurm line, as a user's script: ``LOCAL_RANK`` (which
  ``accelreg run`` supplies from Slurm's) picks ``npu:<LOCAL_RANK>`` through torch's own API;
* ``resolve`` — ``accelreg.resolve()``;
* ``allreduce`` — ``accelreg.resolve()`` and a ``torch.distributed`` all-reduce over
  ``accelreg.dist_backend()``, initialised from the environment alone (``env://``).

The record says the device, its capacity (each emulated physical device has its own size, so
the capacity names the physical device), the device count, the mask and the rank variables; an
accelreg error is recorded (and the exit status is 3). With ``PROBE_HOLD`` set, the task keeps
its device until that file exists (two jobs that must overlap in time).
"""

from __future__ import annotations

import json
import os
import sys
import time

mode = next(a for a in sys.argv[1:] if not a.startswith("--"))  # DeepSpeed's adds --local_rank=N
env = os.environ
name = "-".join(env.get(k, "x") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "RANK"))
record: dict = {
    "job": env.get("SLURM_JOB_ID", ""),
    "task": env.get("RANK") or env.get("SLURM_PROCID"),
    **{
        k: env.get(k)
        for k in (
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "ASCEND_RT_VISIBLE_DEVICES",
            "ACCELREG_DEVICE_ID",
            "ACCELREG_SLURM_TASK",
        )
    },
}
status = 0
try:
    import torch

    if mode == "plain":
        import torch_npu  # noqa: F401 - the vendor package a user's script imports

        device = torch.device("npu", int(env["LOCAL_RANK"]))
        torch.npu.set_device(device)
    else:
        import accelreg

        device = accelreg.resolve()
    runtime = getattr(torch, device.type)
    x = torch.ones(4, device=device)
    record.update(
        device=str(device),
        capacity=runtime.mem_get_info(device.index)[1],
        count=runtime.device_count(),
    )
    if mode == "allreduce":
        import torch.distributed as dist

        dist.init_process_group(accelreg.dist_backend(), device_id=device)
        total = (x * (dist.get_rank() + 1)).sum().reshape(1)
        dist.all_reduce(total)
        record.update(all_reduce=total.item(), world=dist.get_world_size(), dist_backend=dist.get_backend())
        dist.destroy_process_group()
except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
    record["error"] = f"{type(exc).__name__}: {exc}"
    status = 3
out = os.path.join(env["PROBE_RESULTS"], f"{name}.json")
with open(out + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(out + ".tmp", out)  # the test never reads half a file
hold = env.get("PROBE_HOLD")
if hold:
    deadline = time.monotonic() + 120
    while not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.1)
sys.exit(status)
