"""Shared set-up of the DeepSpeed helper scripts (each runs in a fresh interpreter).

Imported by the helpers only, never by pytest's own process: it pulls in torch, transformers,
peft and bitsandbytes. Everything here mirrors what a user of seed 000 does, plus two test
harness details that users with accelerators do not need (see docs/placement.md):

* DeepSpeed JIT-builds a CPU shared-memory comm op (``deepspeed_shm_comm``) in its first
  ``init_distributed``, 85-170 s cold on two cores; :func:`skip_shm_op` replaces the builder.
* bitsandbytes repacks 4-bit weights for a CPU bf16 kernel on processors that have it, which is
  not bit-exact; :func:`pin_bnb` turns that off so results do not depend on the processor.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

T0 = time.time()
RESULT = "@@RESULT@@ "

#: Launcher variables a single-process DeepSpeed run needs (MASTER_PORT is chosen per run).
DS_ENV = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}
LAUNCHER_VARS = (*DS_ENV, "MASTER_PORT")


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def use_accelreg(mode: str) -> None:
    """``install``: the one line a user adds; ``deepspeed``: only the DeepSpeed integration;
    ``none``: upstream (accelreg is never imported)."""
    if mode == "install":
        import accelreg

        accelreg.install()
    elif mode == "deepspeed":
        from accelreg.integrations import deepspeed as ds_integration

        ds_integration.enable()
    elif mode != "none":
        raise SystemExit(f"unknown accelreg mode {mode!r}")


def skip_shm_op() -> None:
    """Test harness only: no JIT build of DeepSpeed's CPU shm comm op (useless at world size 1).

    ``import deepspeed.comm.torch as m`` would bind the *torch* package (``deepspeed.comm``
    re-exports ``torch``), so the module is fetched with ``importlib``.
    """
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    from deepspeed.utils import logger

    logger.setLevel("ERROR")


def pin_bnb() -> None:
    """Pin bitsandbytes' CPU bf16 4-bit repacking off (read in ``Linear4bit.__init__``)."""
    import bitsandbytes.nn.modules as modules

    modules.has_avx512bf16 = lambda: False


def make_tiny_llama(path: str) -> str:
    """The seed's model at tiny scale: Llama, 2 layers, hidden 64, random init, saved locally."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path) or ".", prefix=".tiny-")
    LlamaForCausalLM(config).save_pretrained(tmp)
    try:
        os.rename(tmp, path)
    except OSError:  # another helper made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def build_peft_model(bits: int, model_dir: str, device: str = "cpu") -> Any:
    """from_pretrained quantized onto ``device``, prepare_model_for_kbit_training, LoRA r=8
    alpha=32 q/v."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.manual_seed(0)
    if bits == 8:
        qcfg = BitsAndBytesConfig(load_in_8bit=True)
    else:
        qcfg = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        )
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=qcfg, device_map={"": device}, dtype=torch.float32
    )
    model.config.use_cache = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        r=8,
        lora_alpha=32,
        lora_dropout=0.1,
        target_modules=["q_proj", "v_proj"],
        bias="none",
    )
    return get_peft_model(model, lora)


def ds_config(stage: int, *, trainer: bool) -> dict[str, Any]:
    """fp32, no "optimizer" section: the client passes torch AdamW, so no DeepSpeed op is built.

    ZeRO-3 gets ``stage3_param_persistence_threshold: 0``: below 1e5 elements a parameter is
    "persistent" (never released), so the tiny model would otherwise not be partitioned at all.
    """
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=False)
    auto = "auto" if trainer else None
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": auto or 2,
        "train_batch_size": auto or 2,
        "gradient_accumulation_steps": auto or 1,
        "zero_optimization": zero,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if trainer:
        cfg["gradient_clipping"] = "auto"
    else:
        cfg["zero_allow_untested_optimizer"] = True
    return cfg


def set_ds_env(on: bool) -> None:
    """Launcher variables for a DeepSpeed run; none at all for the plain control (with
    LOCAL_RANK set, Trainer would wrap the model in DDP, which rejects reentrant checkpointing)."""
    if on:
        os.environ.update(DS_ENV)
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    else:
        for key in LAUNCHER_VARS:
            os.environ.pop(key, None)
    if "accelreg" in sys.modules:  # the registry read LOCAL_RANK when it was built
        import accelreg

        accelreg.reset()


def emit(record: dict[str, Any]) -> None:
    record.setdefault("t_total", round(time.time() - T0, 2))
    print(RESULT + json.dumps(record, default=str), flush=True)


def failure(exc: BaseException) -> dict[str, Any]:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return {
        "exc_type": type(exc).__name__,
        "exc": str(exc)[:3000],
        "frames": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in frames[-14:]],
    }


def events_summary(model: Any) -> dict[str, Any]:
    """``accelreg.placement.load_events(model)`` condensed (empty when accelreg is not loaded)."""
    if "accelreg.placement" not in sys.modules:
        return {"n": 0}
    from accelreg.placement import load_events

    events = load_events(model)
    out: dict[str, Any] = {"n": len(events), "devices": sorted({e["device"] for e in events})}
    out["param_missing"] = sum(1 for e in events if not e["param_in_checkpoint"])
    out["notes"] = sorted({e["note"].split(" (")[0].split("lacks ")[0] for e in events if "note" in e})
    out["methods"] = sorted({e["quant_method"] for e in events})
    out["example"] = events[0] if events else None
    return out
