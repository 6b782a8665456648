"""The vendor-parity workflows (issue 36), as a user runs them: ``accelreg.install()`` first, then
transformers, accelerate and peft on whatever device the registry chose, in one process.

    ACCELREG_EMU_NAME=emu ACCELREG_EMU_DEVICES=2 python tests/emu/_parity.py OUT [WORKFLOW ...]

writes what each workflow saw to ``OUT`` (JSON), device types written as ``<device>`` so that the
results under two names compare equal when the workflows behave the same. The workflows (all by
default): ``args`` (TrainingArguments' device, ``n_gpu``, parallel mode, ``bf16=True``), ``trainer``
(train, evaluate, predict, a checkpoint's random state, resume; and the same training on the cpu),
``bf16`` and ``fp16`` (autocast on the device type, fp16's gradient scaler), ``pipeline`` (integer
devices), ``peft`` (LoRA under the Trainer), ``bnb`` (8-bit placement on the device). Tiny models
from configs, two or three steps; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any

import accelreg

accelreg.install()

import torch  # noqa: E402 - after install(), as the workflows are written

#: The workflows, in the order they run (``stock`` last: it uninstalls and installs again).
WORKFLOWS = ("args", "trainer", "bf16", "fp16", "pipeline", "peft", "bnb", "stock")


def kind() -> str:
    """The registry's device type in this process (``emu``, ``npu``, ...)."""
    return accelreg.resolve().type


def generic(value: Any) -> Any:
    """``value`` with this process's device type written as ``<device>`` (``"emu:0"`` ->
    ``"<device>:0"``), so results under two names compare equal."""
    if isinstance(value, dict):
        return {generic(k): generic(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [generic(v) for v in value]
    if isinstance(value, str):
        name = kind()
        if value == name or value.startswith(name + ":"):
            return "<device>" + value[len(name) :]
    return value


def digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in name order (exact equality of weights)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def tensor_digest(t: Any) -> str:
    return hashlib.sha256(torch.as_tensor(t).detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def gpt2(dropout: float = 0.1) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences (language modelling: the labels are the inputs)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def arguments(out: str, **kwargs: Any) -> Any:
    from transformers import TrainingArguments

    settings: dict[str, Any] = {
        "output_dir": out,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 4,
        "learning_rate": 1e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "seed": 0,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    settings.update(kwargs)
    return TrainingArguments(**settings)


def losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


# -- the workflows ---------------------------------------------------------------------------
def args_workflow(tmp: str) -> dict[str, Any]:
    """TrainingArguments' device, n_gpu and parallel mode; bf16=True accepted."""
    a = arguments(tmp)
    b = arguments(tmp, bf16=True)
    return {
        "device": str(a.device),
        "n_gpu": a.n_gpu,
        "parallel_mode": str(a.parallel_mode),
        "current_device": str(accelreg.resolve()),
        "bf16_device": str(b.device),
    }


def _train(tmp: str, **kwargs: Any) -> tuple[Any, Any]:
    from transformers import Trainer

    model = gpt2()
    trainer = Trainer(
        model=model, args=arguments(tmp, **kwargs), train_dataset=Tokens(8, 1), eval_dataset=Tokens(4, 2)
    )
    trainer.train()
    return trainer, model


def trainer_workflow(tmp: str) -> dict[str, Any]:
    """train / evaluate / predict; a checkpoint's random state; resume; the cpu's run beside it."""
    from transformers import Trainer

    trainer, model = _train(os.path.join(tmp, "run"), save_strategy="steps", save_steps=2)
    evaluated = trainer.evaluate()
    predicted = trainer.predict(Tokens(4, 3))
    checkpoint = os.path.join(tmp, "run", "checkpoint-2")
    rng_file = os.path.join(checkpoint, "rng_state.pth")
    states = torch.load(rng_file, weights_only=False)
    device_type = kind()
    # resume from step 2 in a fresh Trainer: the same weights as the uninterrupted run
    resumed = Trainer(model=gpt2(), args=arguments(os.path.join(tmp, "run")), train_dataset=Tokens(8, 1))
    resumed.train(resume_from_checkpoint=checkpoint)
    # the device's own entry is restored: written apart from the cpu's, it is the device's state after loading
    torch.manual_seed(1234)
    states[device_type] = torch.get_rng_state() if device_type in states else None
    torch.save(states, rng_file)
    torch.manual_seed(99)
    resumed._load_rng_state(checkpoint)
    module = getattr(torch, device_type)
    restored = states[device_type] is not None and torch.equal(module.get_rng_state(), states[device_type])
    cpu_trainer, cpu_model = _train(os.path.join(tmp, "cpu"), use_cpu=True)
    return {
        "model_device": str(next(model.parameters()).device),
        "args_device": str(trainer.args.device),
        "losses": losses(trainer),
        "weights": digest(model),
        "eval_loss": evaluated["eval_loss"],
        "predictions": tensor_digest(
            predicted.predictions[0] if isinstance(predicted.predictions, tuple) else predicted.predictions
        ),
        "test_loss": predicted.metrics["test_loss"],
        "rng_keys": sorted(generic(list(states))),
        "device_rng_restored": restored,
        "resumed_weights": digest(resumed.model),
        "cpu_losses": losses(cpu_trainer),
        "cpu_weights": digest(cpu_model),
    }


def _precision(tmp: str, flag: str) -> dict[str, Any]:
    trainer_seen: dict[str, Any] = {}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        device_type = output.device.type
        trainer_seen.setdefault("output_dtype", str(output.dtype))
        trainer_seen.setdefault("autocast", torch.is_autocast_enabled(device_type))
        trainer_seen.setdefault("autocast_dtype", str(torch.get_autocast_dtype(device_type)))

    from transformers import Trainer

    model = gpt2()
    model.lm_head.register_forward_hook(hook)
    trainer = Trainer(
        model=model, args=arguments(tmp, **{flag: True}, max_steps=2), train_dataset=Tokens(8, 1)
    )
    trainer.train()
    scaler = trainer.accelerator.scaler
    return {
        **trainer_seen,
        "native_amp": trainer.accelerator.native_amp,
        "mixed_precision": trainer.accelerator.mixed_precision,
        "scaler_device": getattr(scaler, "_device", None),
        "scaler_scale": float(scaler.get_scale()) if scaler is not None else None,
        "losses": losses(trainer),
        "weights": digest(model),
    }


def bf16_workflow(tmp: str) -> dict[str, Any]:
    return _precision(tmp, "bf16")


def fp16_workflow(tmp: str) -> dict[str, Any]:
    return _precision(tmp, "fp16")


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i for i in range(2, 64)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def pipeline_workflow(tmp: str) -> dict[str, Any]:
    """pipeline(device=0), (device=1) and the default: the registry's devices, not the cpu."""
    from transformers import pipeline

    model = gpt2(dropout=0.0).eval()
    tokenizer = _tokenizer()
    out: dict[str, Any] = {}
    for label, device in (("device_0", 0), ("device_1", 1), ("default", None)):
        kwargs = {} if device is None else {"device": device}
        pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, **kwargs)
        out[label] = str(pipe.device)
        out[label + "_model"] = str(next(pipe.model.parameters()).device)
    generated = pipe("w5 w6 w7", max_new_tokens=4, do_sample=False, return_full_text=False)
    out["generated"] = generated[0]["generated_text"]
    return out


def peft_workflow(tmp: str) -> dict[str, Any]:
    """A LoRA model trained by the Trainer."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    model = get_peft_model(gpt2(), LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.1))
    trainer = Trainer(model=model, args=arguments(tmp, max_steps=2), train_dataset=Tokens(8, 1))
    trainer.train()
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    return {
        "lora_devices": sorted({str(p.device) for p in lora.values()}),
        "losses": losses(trainer),
        "weights": digest(model),
    }


def bnb_workflow(tmp: str) -> dict[str, Any]:
    """bitsandbytes 8-bit: accelreg's placement check, and a quantized load onto the device."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from accelreg.integrations.transformers.quantizers import _check_bnb_device

    device = accelreg.resolve(0)
    out: dict[str, Any] = {}
    try:
        _check_bnb_device(device, "the test's device")
        out["check"] = "accepted"
    except Exception as exc:  # noqa: BLE001 - the answer is reported
        out["check"] = f"{type(exc).__name__}: {exc}"
    folder = os.path.join(tmp, "model")
    gpt2(dropout=0.0).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        quantization_config=BitsAndBytesConfig(load_in_8bit=True),
        device_map="auto",
    )
    weight = model.transformer.h[0].attn.c_attn.weight
    out["weight_device"] = str(weight.device)
    out["weight_dtype"] = str(weight.dtype)
    with torch.no_grad():
        logits = model(torch.arange(8, device=model.device).unsqueeze(0)).logits
    out["logits"] = tensor_digest(logits.float())
    out["refused_where_its_kernels_fail"] = _refused_where_kernels_fail(device)
    return out


def _refused_where_kernels_fail(device: torch.device) -> bool:
    """A device where bitsandbytes' 4-bit kernel fails (registered here for the device's dispatch
    key, as a runtime without the operator would answer): the placement check refuses a 4-bit
    load there, naming bitsandbytes' own error, and still accepts 8-bit."""
    from accelreg.integrations.transformers.quantizers import _check_bnb_device

    key = "PrivateUse1" if device.type == torch._C._get_privateuse1_backend_name() else device.type.upper()

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"bitsandbytes::quantize_4bit has no kernel for {key}")

    library = torch.library.Library("bitsandbytes", "IMPL")
    library.impl("quantize_4bit", missing, key)
    accelreg.reset()  # the placement rules are asked again
    try:
        _check_bnb_device(device, "the test's device", "bnb_8bit")
        try:
            _check_bnb_device(device, "the test's device", "bnb_4bit")
        except accelreg.PlacementError as exc:
            return "cannot run its 4-bit kernels" in str(exc) and "has no kernel" in str(exc)
        return False
    finally:
        library._destroy()
        accelreg.reset()


def stock_workflow(tmp: str) -> dict[str, Any]:
    """The same questions to the libraries without accelreg's integrations (the canary: where
    they fall through for a device type they do not know)."""
    from transformers import pipeline
    from transformers.utils import import_utils

    import accelreg.integrations

    accelreg.integrations.uninstall()
    try:
        a = arguments(tmp)
        pipe = pipeline("text-generation", model=gpt2(dropout=0.0), tokenizer=_tokenizer(), device=0)
        return {
            "device": str(a.device),
            "n_gpu": a.n_gpu,
            "bf16_gpu_available": import_utils.is_torch_bf16_gpu_available(),
            "pipeline_device_0": str(pipe.device),
        }
    finally:
        accelreg.install()


def main() -> None:
    out_path = sys.argv[1]
    chosen = sys.argv[2:] or list(WORKFLOWS)
    results: dict[str, Any] = {"device_type": kind()}
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            os.makedirs(os.path.join(tmp, name))
            results[name] = generic(globals()[f"{name}_workflow"](os.path.join(tmp, name)))
    with open(out_path, "w") as fh:
        json.dump(results, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
