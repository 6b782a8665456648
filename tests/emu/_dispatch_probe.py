"""One hash seed's run of the patch-free check (tests/emu/test_patch_free_dispatch.py).

Run as a script on the emulated npu (two devices whose capacity is the budget), with
``PYTHONHASHSEED`` set by the caller: ``python _dispatch_probe.py BUDGET``. It prints one JSON line:
what stock ``from_pretrained`` did with ``device_map_for``'s map, the same under ``install()``,
and the ``install()``-path map under stock dispatch (last: it may run out of memory). The hash
seed is fixed when an interpreter starts, so each seed needs its own process.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import warnings
from typing import Any

import torch
import torch_npu  # noqa: F401 - the vendor package brings the emulated runtime up
from transformers import GPT2Config, GPT2LMHeadModel

import accelreg
import accelreg.integrations
from accelreg.planner import plan


def load_and_run(path: str, device_map: dict[str, str], ids: Any, reference: Any) -> dict[str, Any]:
    """Load with stock ``from_pretrained``, run one token, report where offloaded layers ran and
    each device's peak memory (or the out-of-memory error)."""
    for i in range(2):
        torch.npu.reset_peak_memory_stats(i)
    out: dict[str, Any] = {"map": device_map}
    try:
        model = GPT2LMHeadModel.from_pretrained(path, device_map=device_map).eval()
        hooks = [m._hf_hook for n, m in model.named_modules() if device_map.get(n) == "cpu"]
        out["offloaded_on"] = sorted({str(h.execution_device) for h in hooks})
        with torch.no_grad():
            logits = model(input_ids=ids.to("npu:0")).logits.cpu()
        out["matches_cpu"] = bool(torch.allclose(logits, reference, atol=1e-5))
        del model
    except torch.OutOfMemoryError as exc:
        out["oom"] = str(exc).splitlines()[0]
    out["peak"] = [torch.npu.max_memory_allocated(i) for i in range(2)]
    gc.collect()
    return out


def main(budget: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    cfg = GPT2Config(
        n_layer=4, n_embd=64, n_head=2, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    path = tempfile.mkdtemp()
    ref.save_pretrained(path)
    ids = torch.randint(0, 1000, (1, 1))
    with torch.no_grad():
        reference = ref(input_ids=ids).logits
    with torch.device("meta"):
        meta = GPT2LMHeadModel(cfg)
    budgets = {"npu:0": budget, "npu:1": budget, "cpu": 100_000_000}
    patch_free = accelreg.device_map_for(meta, budgets)
    accelreg.check_device_map(meta, patch_free, budgets, any_main=True)
    installed = plan(meta, budgets)
    result = {
        "stock": load_and_run(path, patch_free, ids, reference),
        "install_path_main": installed.main_device,
        "resident": {
            "patch_free": plan(meta, budgets, any_main=True).resident,
            "install": installed.resident,
        },
    }
    accelreg.install()
    result["installed"] = load_and_run(path, patch_free, ids, reference)
    accelreg.integrations.uninstall()
    result["install_path_map"] = load_and_run(path, installed.device_map, ids, reference)
    return result


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
