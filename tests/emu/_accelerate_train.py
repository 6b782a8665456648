"""A plain accelerate training script, as a user writes it (no accelreg line unless
``--install``): ``accelerate launch ... _accelerate_train.py OUT [--install] [--clip N]``.

Each rank trains a tiny regression model with ``Accelerator()`` (prepare, autocast under the
launcher's ``--mixed_precision``, backward, step), then runs an ``all_reduce`` of ones, a
``gather``, a ``reduce``, ``wait_for_everyone``, ``save_state`` and ``load_state`` (after
perturbing the parameters), and writes what it saw to ``OUT/rank<r>.json``: among it the trained
parameters as this rank holds them (``params``: FSDP's shards under FSDP) and the whole model's
(``full``: ``get_state_dict``, gathered on the main process under FSDP and DeepSpeed).
"""

from __future__ import annotations

import json
import os
import sys

if "--install" in sys.argv:
    import accelreg

    accelreg.install()

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

#: ``--clip N``: clip the gradients' norm to N before each step.
CLIP = float(sys.argv[sys.argv.index("--clip") + 1]) if "--clip" in sys.argv else 0.0


def main() -> None:
    out = sys.argv[1]
    accelerator = Accelerator()
    state = accelerator.state
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, str] = {}  # the first layer's output dtype: bfloat16 under bf16 autocast
    model[0].register_forward_hook(lambda _m, _i, output: seen.update(matmul=str(output.dtype)))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for xb, yb in loader:
        optimizer.zero_grad()
        prediction = model(xb)  # accelerate's autocast wraps the prepared model's forward
        loss = torch.nn.functional.mse_loss(prediction.float(), yb)
        accelerator.backward(loss)
        if CLIP:  # what accelerate's DeepSpeed engine does by default (gradient_clipping 1.0)
            accelerator.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
    device = accelerator.device
    ones = torch.ones(1, device=device)
    if dist.is_initialized():
        dist.all_reduce(ones)
    gathered = accelerator.gather(torch.tensor([accelerator.process_index], device=device))
    reduced = accelerator.reduce(torch.ones(1, device=device), reduction="sum")
    accelerator.wait_for_everyone()
    trained = [p.detach().cpu().clone() for p in accelerator.unwrap_model(model).parameters()]
    full = [v.detach().cpu().flatten().tolist() for v in accelerator.get_state_dict(model).values()]
    ckpt = os.path.join(out, "state")
    accelerator.save_state(ckpt)
    accelerator.wait_for_everyone()  # the main process writes the files the others load
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(ckpt)
    restored = all(
        torch.equal(a, p.detach().cpu())
        for a, p in zip(trained, accelerator.unwrap_model(model).parameters(), strict=True)
    )
    masks = {k: v for k, v in os.environ.items() if k.endswith(("VISIBLE_DEVICES", "VISIBLE_MODULES"))}
    emulated = None
    try:
        import accelreg_emu

        if accelreg_emu.is_active():
            emulated = accelreg_emu.config()["visible"]
    except ImportError:
        pass
    record = {
        "rank": accelerator.process_index,
        "local_rank": accelerator.local_process_index,
        "processes": accelerator.num_processes,
        "distributed_type": str(state.distributed_type).split(".")[-1],
        "device": str(device),
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "process_group": dist.get_backend() if dist.is_initialized() else None,
        "mixed_precision": str(state.mixed_precision),
        "matmul": seen.get("matmul"),
        "all_reduce": ones.item(),
        "gather": gathered.cpu().tolist(),
        "reduce": reduced.item(),
        "restored": restored,
        "params": [t.tolist() for t in trained],
        "full": full,
        "zero_stage": getattr(getattr(state, "deepspeed_plugin", None), "zero_stage", None),
        "masks": masks,
        "emulated_visible": emulated,
        "accelerator": str(torch.accelerator.current_accelerator()),
    }
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as fh:
        json.dump(record, fh)
    accelerator.end_training()


if __name__ == "__main__":
    main()
