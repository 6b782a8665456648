"""One rank of a Trainer run with a DeepSpeed config, as a user writes it (no accelreg line: it
runs under ``accelreg run -- torchrun ...`` or ``accelreg run -- deepspeed ...``):

    accelreg run -- torchrun --nproc-per-node 2 tests/emu/_parity_launch.py OUT

Each rank trains the parity workflows' tiny GPT-2 for three steps (ZeRO stage 1, fp32; a
checkpoint at step 2) and writes ``OUT/rank<r>.json``: TrainingArguments' device, ``n_gpu``,
parallel mode and distributed type, the model's device, the losses, the weights and the keys of
its checkpoint's random-state file, device types written as ``<device>``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _parity import Tokens, digest, generic, gpt2, losses

DEEPSPEED = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 1},
    # DeepSpeed builds no fused kernels for a device type it ships no accelerator for: torch's AdamW
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
}


def main() -> None:
    from transformers import Trainer, TrainingArguments

    out = next(a for a in sys.argv[1:] if not a.startswith("--local_rank"))  # deepspeed adds --local_rank
    args = TrainingArguments(
        output_dir=os.path.join(out, "run"),
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        max_steps=3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        report_to=[],
        seed=0,
        disable_tqdm=True,
        deepspeed=DEEPSPEED,
    )
    model = gpt2()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(8, 1))
    trainer.train()
    rank = args.process_index
    states = torch.load(os.path.join(out, "run", "checkpoint-2", f"rng_state_{rank}.pth"), weights_only=False)
    record = {
        "rank": rank,
        "device": str(args.device),
        "n_gpu": args.n_gpu,
        "parallel_mode": str(args.parallel_mode),
        "distributed_type": str(args.distributed_state.distributed_type),
        "model_device": str(next(trainer.model.parameters()).device),
        "deepspeed": trainer.is_deepspeed_enabled,
        "losses": losses(trainer),
        "weights": digest(trainer.accelerator.unwrap_model(trainer.model)),
        "rng_keys": sorted(generic(list(states))),
    }
    path = os.path.join(out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(generic(record), fh)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
