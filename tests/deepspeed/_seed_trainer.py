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


def attached(model: Any) -> int:
    return sum(1 for m in model.modules() if "_accelreg_placement" in m.__dict__)


def lora_live(model: Any) -> dict[str, Any]:
    params = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
    if any(hasattr(p, "ds_id") for _, p in params):  # ZeRO-3: gather the partitioned matrices
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            return {n: p.detach().cpu().clone() for n, p in params}
    return {n: p.detach().cpu().clone() for n, p in params}


def check_adapter(trainer: Any, model: Any) -> dict[str, Any]:
    """Live LoRA matrices vs the best checkpoint's adapter file, bit for bit; live SCB vs the
    DeepSpeed module file."""
    import torch
    from safetensors.torch import load_file

    best = trainer.state.best_model_checkpoint
    saved = load_file(os.path.join(best, "adapter_model.safetensors"))
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
        "lora_equal": equal,
        "lora_n": len(live),
        "bad": bad[:4],
    }
    runs = sorted(
        glob.glob(os.path.join(os.path.dirname(best), "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1])
    )
    out["last"] = os.path.basename(runs[-1])
    if runs[-1] != best:
        last = load_file(os.path.join(runs[-1], "adapter_model.safetensors"))
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
    from transformers import Trainer, TrainerCallback, TrainingArguments

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
    trainer = Trainer(
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
