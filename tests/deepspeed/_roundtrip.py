"""DeepSpeed engine round trip on a bitsandbytes-quantized peft model (driven by ``_run.py``).

``deepspeed.initialize`` on the peft model, train 2 steps, snapshot, ``save_checkpoint``, train
2 more, corrupt every live quantized tensor (int8 weight and bitsandbytes' private copy, SCB;
4-bit packed weight, absmax, nested absmax, offset), ``load_checkpoint``, then compare every
quantized tensor and every LoRA matrix with the snapshot, bit for bit.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import _harness as H


def quant_tensors(model: Any) -> dict[str, Any]:
    """Every live quantized tensor, where bitsandbytes computes with it."""
    import torch
    from bitsandbytes.nn import Linear4bit, Linear8bitLt

    out: dict[str, Any] = {}
    for name, m in model.named_modules():
        weight = getattr(m, "weight", None)
        data = (
            getattr(weight, "ds_tensor", None)
            if hasattr(weight, "ds_tensor")
            else getattr(weight, "data", None)
        )
        if isinstance(m, Linear8bitLt):
            out[name + ".weight"] = data
            out[name + ".SCB"] = weight.SCB if weight.SCB is not None else m.state.SCB
            if m.state.CB is not None:
                out[name + ".state.CB"] = m.state.CB
        elif isinstance(m, Linear4bit):
            qs = weight.quant_state
            out[name + ".weight"] = data
            out[name + ".weight.absmax"] = qs.absmax
            out[name + ".weight.quant_map"] = qs.code
            if qs.state2 is not None:
                out[name + ".weight.nested_absmax"] = qs.state2.absmax
                out[name + ".weight.nested_quant_map"] = qs.state2.code
                out[name + ".weight.offset"] = qs.offset
            out[name + ".quant_state_shared"] = torch.tensor(m.quant_state is qs)
    return out


def lora_tensors(model: Any) -> dict[str, Any]:
    return {
        n: (p.ds_tensor if hasattr(p, "ds_tensor") else p.data)
        for n, p in model.named_parameters()
        if "lora_" in n
    }


def snapshot(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone().cpu() for k, v in tensors.items()}


def corrupt(model: Any) -> None:
    import torch
    from bitsandbytes.nn import Linear4bit, Linear8bitLt

    with torch.no_grad():
        for _, m in model.named_modules():
            if isinstance(m, Linear8bitLt):
                if hasattr(m.weight, "ds_tensor"):  # ZeRO-3: the partition and bitsandbytes' full copy
                    m.weight.ds_tensor.neg_()
                    if m.state.CB is not None:
                        m.state.CB.neg_()
                else:
                    m.weight.data.neg_()  # state.CB aliases it
                (m.weight.SCB if m.weight.SCB is not None else m.state.SCB).mul_(3.0)
            elif isinstance(m, Linear4bit):
                (m.weight.ds_tensor if hasattr(m.weight, "ds_tensor") else m.weight.data).bitwise_xor_(0x5A)
                qs = m.weight.quant_state
                if qs.absmax.dtype == torch.uint8:
                    qs.absmax.add_(7)
                else:
                    qs.absmax.mul_(3.0)
                if qs.state2 is not None:
                    qs.state2.absmax.mul_(3.0)
                    qs.offset.add_(1.0)


def batch(seed: int) -> Any:
    import torch

    return torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(seed))


def train(engine: Any, steps: int, seed: int) -> None:
    for i in range(steps):
        x = batch(seed + i)
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()


def eval_loss(engine: Any) -> float:
    import torch

    engine.eval()
    with torch.no_grad():
        x = batch(999)
        loss = engine(input_ids=x, labels=x).loss.item()
    engine.train()
    return loss


def _file_key(key: str) -> str:
    """The checkpoint key that carries a live tensor."""
    if key.endswith(".state.CB"):
        return key[: -len(".state.CB")] + ".weight"
    if key.endswith(".weight.offset"):
        return key[: -len(".offset")] + ".quant_state.bitsandbytes__nf4"
    return key


def compare(q0: dict[str, Any], model: Any, carried: set[str]) -> dict[str, Any]:
    import torch

    q1 = quant_tensors(model)
    restored, absent, mismatch = 0, [], []
    for key, value in q0.items():
        if torch.equal(q1[key].detach().cpu(), value):
            restored += 1
        elif _file_key(key) not in carried and not key.endswith(".quant_state_shared"):
            absent.append(key)
        else:
            mismatch.append(key)
    return {
        "n": len(q0),
        "restored": restored,
        "absent_kept": len(absent),
        "mismatch": mismatch[:8],
        "mismatch_n": len(mismatch),
        "absent_example": absent[:2],
    }


def run_case(
    mode: str, bits: int, stage: int, ef: bool, strict: bool, model_dir: str, out_root: str
) -> dict[str, Any]:
    import deepspeed
    import torch

    H.set_ds_env(True)
    t0 = time.time()
    model = H.build_peft_model(bits, model_dir)
    record: dict[str, Any] = {
        "mode": mode,
        "bits": bits,
        "stage": stage,
        "exclude_frozen": ef,
        "strict": strict,
    }
    record["attached_before_initialize"] = _attached(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, config=H.ds_config(stage, trainer=False)
    )
    record["attached_after_initialize"] = _attached(model)
    train(engine, 2, 0)
    loss_saved = eval_loss(engine)
    q0, l0 = snapshot(quant_tensors(model)), snapshot(lora_tensors(model))
    ck = os.path.join(out_root, f"rt-{mode}-b{bits}-s{stage}-ef{int(ef)}-st{int(strict)}")
    shutil.rmtree(ck, ignore_errors=True)
    engine.save_checkpoint(ck, tag="t", exclude_frozen_parameters=ef)
    name = next(f for f in sorted(os.listdir(os.path.join(ck, "t"))) if f.endswith("model_states.pt"))
    saved = torch.load(os.path.join(ck, "t", name), map_location="cpu", weights_only=False)
    carried = {k for k, v in saved["module"].items() if v.numel() > 0} | set(
        saved.get("frozen_param_fragments") or {}
    )
    record["frozen_param_fragments"] = len(saved.get("frozen_param_fragments") or {})
    train(engine, 2, 100)
    corrupt(model)
    n_events = len(_events(model))
    try:
        engine.load_checkpoint(ck, tag="t", load_module_strict=strict)
        record["load"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the outcome is the result
        record["load"] = "raised"
        record.update(H.failure(exc))
        message = str(exc)
        if "Missing key(s)" in message:
            listed = message.split("Missing key(s) in state_dict: ")[1].split(". \n")[0]
            missing = [k.strip().strip('"') for k in listed.split(",")]
            record["missing_n"] = len(missing)
            record["missing_quantized"] = sum(1 for k in missing if k.endswith(".weight") and "_proj" in k)
            record["missing_other_examples"] = [k for k in missing if "_proj" not in k][:4]
        record["unexpected_in_message"] = "Unexpected key(s)" in message
    events = _events(model)[n_events:]
    record["events"] = {
        "n": len(events),
        "param_missing": sum(1 for e in events if not e["param_in_checkpoint"]),
        "noted": sum(1 for e in events if "note" in e),
        "devices": sorted({e["device"] for e in events}),
        "example": events[0] if events else None,
    }
    record["quant_before_forward"] = compare(q0, model, carried)
    l1 = lora_tensors(model)
    record["lora_restored"] = sum(int(torch.equal(l1[k].detach().cpu(), v)) for k, v in l0.items())
    record["lora_n"] = len(l0)
    record["loss_saved"] = loss_saved
    try:
        record["loss_after_load"] = eval_loss(engine)
        record["loss_equal"] = record["loss_after_load"] == loss_saved
    except Exception as exc:  # noqa: BLE001
        record["loss_after_load"] = f"{type(exc).__name__}: {exc}"
        record["loss_equal"] = False
    record["quant"] = compare(q0, model, carried)  # after one forward (ZeRO-3 re-syncs bnb's copy there)
    if ef:  # the frozen weights were not saved: put the intact ones back, then the loss must match
        live = quant_tensors(model)
        with torch.no_grad():
            for key, value in q0.items():
                if _file_key(key) not in carried and (key.endswith(".weight") or key.endswith(".state.CB")):
                    live[key].copy_(value)
        try:
            record["loss_equal_with_intact_weights"] = eval_loss(engine) == loss_saved
        except Exception as exc:  # noqa: BLE001
            record["loss_equal_with_intact_weights"] = f"{type(exc).__name__}: {exc}"
    engine.destroy()
    shutil.rmtree(ck, ignore_errors=True)
    record["t_case"] = round(time.time() - t0, 2)
    return record


def _attached(model: Any) -> int:
    return sum(1 for m in model.modules() if "_accelreg_placement" in m.__dict__)


def _events(model: Any) -> list[dict[str, Any]]:
    import sys

    if "accelreg.placement" not in sys.modules:
        return []
    from accelreg.placement import load_events

    return load_events(model)
