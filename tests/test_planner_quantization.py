"""Planning bitsandbytes 8-bit / 4-bit models: sizes from the placement rules, pinned weights."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import accelreg
from accelreg.planner import plan
from accelreg.planner.plan import analyze

from ._planner_support import quiet, violations

MB = 10**6


def gpt2(layers: int = 4, vocab: int = 1000) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    quiet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GPT2Config(n_layer=layers, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def place_of(device_map, name):
    (key,) = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
    return device_map[key]


def test_quantized_sizes_come_from_the_rule_and_follow_transformers_choice_of_weights():
    model = gpt2()
    layout, method, _ = analyze(model, quantization="8bit", dtype="float16", backend="npu")
    assert method == "bnb_8bit"
    quantized = sorted(layout.names[t] for t in layout.quantized)
    # Conv1D projections of every block; never the tied embedding / output head
    assert len(quantized) == 4 * 4 and all(".attn.c_" in n or ".mlp.c_" in n for n in quantized)
    rule = accelreg.placement_rule("npu", "bnb_8bit")
    c_fc = model.transformer.h[0].mlp.c_fc.weight  # Conv1D stores (in, out)
    t = layout.tensor_index["transformer.h.0.mlp.c_fc.weight"]
    assert layout.nbytes[t] == rule.quantized_nbytes((c_fc.shape[1], c_fc.shape[0])) == 768 * 3072 + 3072 * 4
    four, _, _ = analyze(model, quantization="4bit", dtype="float16", backend="npu")
    t4 = four.tensor_index["transformer.h.0.mlp.c_fc.weight"]
    assert four.nbytes[t4] == 768 * 3072 // 2 + math.ceil(768 * 3072 / 64) * 4 + 64
    plain, _, _ = analyze(model, dtype="float16")
    assert four.total < layout.total < plain.total


def test_quantized_weights_never_go_where_their_rule_forbids():
    model = gpt2()
    budgets = {"npu:0": 16 * MB, "npu:1": 15 * MB, "cpu": "1GB"}
    result = plan(model, budgets, quantization="8bit", dtype="float16")
    where = {u.place: u.keys for u in result.places}
    assert set(where["npu:0"] + where["npu:1"]) >= {f"transformer.h.{i}" for i in range(4)}
    assert "transformer.wte" in where["cpu"]  # the unquantized embedding is offloaded instead
    assert violations(model, result.device_map, budgets, quantization="8bit", dtype="float16") == ()
    unquantized = plan(model, budgets, quantization=False, dtype="float16").device_map
    assert place_of(unquantized, "transformer.h.3.mlp.c_fc.weight") == "cpu"  # unpinned, it is offloaded


def test_no_fit_because_of_the_rule_says_so():
    model = gpt2()
    with pytest.raises(accelreg.DeviceMapError) as info:
        accelreg.plan_device_map(
            model, {"npu:0": 15 * MB, "npu:1": 15 * MB, "cpu": "1GB"}, quantization="8bit", dtype="float16"
        )
    text = "\n".join(info.value.violations)
    assert "bnb_8bit weights" in text and "keeps off cpu and disk" in text and "headroom" in text


def test_on_the_cpu_backend_quantized_weights_may_live_on_cpu_but_not_disk():
    model = gpt2()
    assert plan(model, {"cpu": "1GB"}, quantization="4bit").device_map == {"": "cpu"}
    with pytest.raises(accelreg.DeviceMapError, match="cannot place"):
        accelreg.plan_device_map(model, {"cpu": 3 * MB, "disk": "1GB"}, quantization="8bit", dtype="float16")


def test_check_reports_a_quantized_weight_on_the_cpu():
    model = gpt2(layers=2)
    device_map = {
        "transformer.wte": "npu:0",
        "transformer.wpe": "npu:0",
        "transformer.h.0": "npu:0",
        "transformer.h.1": "cpu",
        "transformer.ln_f": "npu:0",
        "lm_head": "npu:0",
    }
    found = violations(model, device_map, {"npu:0": "1GB", "cpu": "1GB"}, quantization="8bit")
    assert any("transformer.h.1.attn.c_attn.weight" in v and "bnb_8bit" in v and "cpu" in v for v in found)


def test_quantization_is_detected_from_the_config():
    from transformers import BitsAndBytesConfig

    model = gpt2()
    model.config.quantization_config = BitsAndBytesConfig(load_in_4bit=True)
    assert plan(model, {"npu:0": "1GB"}).quantization == "bnb_4bit"
    assert plan(model, {"npu:0": "1GB"}, quantization=False).quantization is None
    with pytest.raises(ValueError, match="accepted"):
        plan(model, {"npu:0": "1GB"}, quantization="3bit")


def test_bitsandbytes_modules_are_detected_and_sized_by_the_rule():
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is part of accelreg[bnb]")
    with torch.device("meta"):
        model = nn.Sequential(
            nn.Embedding(100, 64), bnb.nn.Linear8bitLt(64, 256, has_fp16_weights=False), nn.Linear(256, 100)
        )
    result = plan(model, {"npu:0": "1MB", "cpu": "1GB"})
    assert result.quantization == "bnb_8bit"
    layout = result.layout
    t = layout.tensor_index["1.weight"]
    assert layout.nbytes[t] == 64 * 256 + 256 * 4
    assert len(layout.quantized) == 1  # only the bitsandbytes layer: the model is already converted
    assert dict(result.device_map).get("1", "npu:0") == "npu:0"
