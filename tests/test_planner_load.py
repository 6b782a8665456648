"""A plan is usable as ``from_pretrained(device_map=...)`` input (CPU only: cpu + disk budgets)."""

from __future__ import annotations

import warnings

import torch

import accelreg

from ._planner_support import quiet, total_bytes, violations


def test_a_planned_map_loads_with_from_pretrained_and_gives_the_same_loss(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    quiet()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GPT2Config(
            n_layer=4, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
        )
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "model")
    with torch.device("meta"):
        meta = GPT2LMHeadModel(config)
    total = total_bytes(meta)
    budgets = {"cpu": total // 2, "disk": 2 * total}
    device_map = accelreg.plan_device_map(meta, budgets)
    assert set(device_map.values()) == {"cpu", "disk"}
    assert violations(meta, device_map, budgets) == ()
    ids = torch.randint(0, 1000, (2, 16))
    plain = GPT2LMHeadModel.from_pretrained(tmp_path / "model").eval()
    offloaded = GPT2LMHeadModel.from_pretrained(
        tmp_path / "model", device_map=device_map, offload_folder=str(tmp_path / "offload")
    ).eval()
    assert offloaded.hf_device_map == device_map
    with torch.no_grad():
        expected = plain(ids, labels=ids).loss
        got = offloaded(ids, labels=ids).loss
    torch.testing.assert_close(got, expected)
