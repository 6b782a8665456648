"""Seed 000 through Trainer: one configuration per :func:`run` call (driven by ``_run.py``).

The seed's configuration at tiny scale: 8-bit Llama + LoRA, Trainer with a DeepSpeed fp32
config (or none, for the control), eval and save every 2 steps, ``load_best_model_at_end``
with ``metric_for_best_model="eval_loss"``.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any

import _harness as H


def seed_trainer_class() -> Any:
    """``Trainer`` whose optimizer has no empty parameter group; otherwise the stock one.

    Trainer puts the trainable weights into a decay and a no-decay group; LoRA (``bias="none"``)
    trains no bias or norm, so the no-decay group is empty. DeepSpeed drops empty groups from a
    client optimizer in ``deepspeed.initialize``. transformers 4.57's ``deepspeed_optim_sched``
    builds the lr scheduler *before* that, on two groups (5.x no longer builds it there), and
    torch >= 2.10's ``LRScheduler._update_lr`` zips them with ``strict=True``: every LoRA +
    DeepSpeed Trainer run fails at its first step with "zip() argument 2 is longer than argument
    1", long before the seed's checkpoint load. Dropping the empty group here is what DeepSpeed
    does anyway and keeps the scheduler in step on every release: on transformers 5.24, where the
    stock Trainer runs, both give bit-identical eval losses for the control and ZeRO 0-3.
    """
    from transformers import Trainer

    class SeedTrainer(Trainer):
        def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
            optimizer = super().create_optimizer(*args, **kwargs)
            optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
            return optimizer

    return SeedTrainer


def attached(model: Any) -> int:
    return sum(1 for m in model.modules() if "_accelreg_placement" in m.__dict__)


def lora_live(model: Any) -> dict[str, Any]:
    params = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
    if any(hasattr(p, "ds_id") for _, p in params):  # ZeRO-3: gather the partitioned matrices
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            return {n: p.detach().cpu().clone() for n, p in params}
    return {n: p.detach().cpu().clone() for n, p in params}


def saved_lora(checkpoint: str) -> tuple[dict[str, Any], str]:
    """The LoRA matrices a Trainer checkpoint holds (keys as in the adapter file), and where from.

    The adapter file, unless it holds none: under ZeRO-3 without
    ``stage3_gather_16bit_weights_on_model_save``, transformers 4.57 writes an empty adapter file
    (its Trainer saves ``state_dict={}``; 5.x consolidates a PEFT model's trainable weights), and
    the weights are only in DeepSpeed's checkpoint, which is what the best-model load reads
    anyway. Then DeepSpeed's fp32 reconstruction of that checkpoint is the reference (training
    is fp32, so it is the live weights' exact value).
    """
    from safetensors.torch import load_file

    path = os.path.join(checkpoint, "adapter_model.safetensors")
    try:
        saved = load_file(path)
    except Exception:
        # safetensors 0.4.3 (the oldest release set's) writes an empty dict with metadata as a
        # header it cannot read back ('{},"__metadata__":...'): that empty adapter file is the case
        # above, and the weights are in DeepSpeed's checkpoint
        with open(path, "rb") as fh:
            if b'{},"__metadata__"' not in fh.read(64):
                raise
        saved = {}
    if any("lora_" in k for k in saved) or not glob.glob(os.path.join(checkpoint, "global_step*")):
        return saved, "adapter file"
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    full = get_fp32_state_dict_from_zero_checkpoint(checkpoint, exclude_frozen_parameters=True)
    return {k.replace(".default", ""): v for k, v in full.items() if "lora_" in k}, "deepspeed checkpoint"


def check_adapter(trainer: Any, model: Any) -> dict[str, Any]:
    """Live LoRA matrices vs the best checkpoint's adapter file (or DeepSpeed's checkpoint, see
    :func:`saved_lora`), bit for bit; live SCB vs the DeepSpeed module file."""
    import torch

    best = trainer.state.best_model_checkpoint
    saved, source = saved_lora(best)
    live = lora_live(model)
    equal, bad = 0, []
    for name, value in live.items():
        key = name.replace(".default", "")
        if key in saved and saved[key].shape == value.shape and torch.equal(saved[key], value):
            equal += 1
        else:
            bad.append(name)
    out: dict[str, Any] = {
        "best": os.path.basename(best),
        "source": source,
        "lora_equal": equal,
        "lora_n": len(live),
        "bad": bad[:4],
    }
    runs = sorted(
        glob.glob(os.path.join(os.path.dirname(best), "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1])
    )
    out["last"] = os.path.basename(runs[-1])
    if runs[-1] != best:
        last = saved_lora(runs[-1])[0]
        out["best_differs_from_last"] = any(not torch.equal(last[k], saved[k]) for k in saved)
    files = sorted(glob.glob(os.path.join(best, "global_step*", "*model_states.pt")))
    if files:
        module = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
        scb_equal = scb_n = 0
        for name, mod in model.named_modules():
            if name + ".SCB" in module and hasattr(mod, "state"):
                live_scb = mod.weight.SCB if getattr(mod.weight, "SCB", None) is not None else mod.state.SCB
                scb_n += 1
                scb_equal += int(torch.equal(live_scb.cpu(), module[name + ".SCB"]))
        out.update(scb_equal=scb_equal, scb_n=scb_n)
    return out


def run(
    mode: str,
    stage: int | None,
    model_dir: str,
    out_root: str,
    steps: int,
    *,
    bits: int = 8,
    device: str = "cpu",
) -> dict[str, Any]:
    """One Trainer run; ``device`` is where the quantized model is loaded (and Trainer's device:
    the cpu, or the accelerator accelerate picks for this rank)."""
    import torch
    from transformers import TrainerCallback, TrainingArguments

    use_ds = stage is not None
    H.set_ds_env(use_ds)
    t0 = time.time()
    model = H.build_peft_model(bits, model_dir, device)
    record: dict[str, Any] = {
        "mode": mode,
        "stage": stage,
        "deepspeed": use_ds,
        "attached_before_trainer": attached(model),
    }
    gen = torch.Generator().manual_seed(0)

    class Data(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.x = torch.randint(3, 128, (n, 16), generator=gen)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {
                "input_ids": self.x[i],
                "attention_mask": torch.ones(16, dtype=torch.long),
                "labels": self.x[i],
            }

    evals: list[Any] = []

    class Record(TrainerCallback):
        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
            evals.append((state.global_step, metrics.get("eval_loss")))

    kwargs: dict[str, Any] = dict(
        output_dir=os.path.join(
            out_root, f"{mode}-{bits}bit-{device.replace(':', '')}-{'ds' + str(stage) if use_ds else 'nods'}"
        ),
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        max_steps=steps,
        learning_rate=5e-3,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_steps=1,
        report_to=[],
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    if use_ds:
        kwargs["deepspeed"] = H.ds_config(stage, trainer=True)
    trainer = seed_trainer_class()(
        model=model,
        args=TrainingArguments(**kwargs),
        train_dataset=Data(16),
        eval_dataset=Data(4),
        callbacks=[Record()],
    )
    try:
        trainer.train()
        record["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the outcome is the result
        record["ok"] = False
        record.update(H.failure(exc))
    record["evals"] = evals
    record["wrapped"] = type(trainer.model_wrapped).__name__
    record["launcher_vars"] = sorted(k for k in H.LAUNCHER_VARS if k in os.environ)
    record["best_metric"] = trainer.state.best_metric
    record["attached_after"] = attached(model)
    if record["ok"]:
        import _roundtrip

        record["adapter"] = check_adapter(trainer, model)
        live = _roundtrip.quant_tensors(model)
        record["quant_devices"] = sorted(
            {str(t.device) for k, t in live.items() if not k.endswith("quant_state_shared")}  # a cpu flag
        )
        try:
            record["eval_after_load"] = trainer.evaluate()["eval_loss"]
        except Exception as exc:  # noqa: BLE001
            record["eval_after_load"] = f"{type(exc).__name__}: {exc}"
    record["events"] = H.events_summary(model)
    # As a fresh process would: forget transformers' global "ZeRO-3 is on" (a weak reference to
    # the Trainer's DeepSpeed config), or the next from_pretrained refuses a device_map.
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    del trainer
    unset_hf_deepspeed_config()
    record["t_config"] = round(time.time() - t0, 2)
    return record
