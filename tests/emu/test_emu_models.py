"""Stock transformers/accelerate on the emulated ``npu``: a tiny GPT-2 split over two devices,
a device map that overcommits a device, and the canaries of seeds 001 and 002.

Nothing is downloaded: the models are random-initialised and saved to a temporary
directory. accelreg itself is not used here; these tests pin down upstream behaviour that
accelreg exists to fix, so a canary that stops failing says so. One child process runs them all.
"""

from __future__ import annotations

import gc
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.emu, pytest.mark.accelreg_emu(name="npu", devices=2, memory="64MiB,4MiB")]

MIB = 1 << 20
SAME = "Expected all tensors to be on the same device, but found at least two devices"
CHANGED = "upstream behaviour changed: "
# A CPU-only torch says this; a CUDA build on a machine without a GPU fails the same call
# with a driver error instead.
NO_CUDA = (
    ("Torch not compiled with CUDA enabled",)
    if torch.version.cuda is None
    else ("Found no NVIDIA driver", "No CUDA GPUs are available", "CUDA driver initialization failed")
)


def cuda_refused(exc: BaseException) -> bool:
    return any(fragment in str(exc) for fragment in NO_CUDA)


@dataclass(frozen=True)
class Models:
    """The tiny and the wide GPT-2, saved; the ids and the tiny one's loss on the cpu."""

    tiny: Any
    tiny_path: str
    wide_path: str
    ids: torch.Tensor
    cpu_loss: float


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Models:
    importlib.import_module("torch_npu")  # the vendor package brings the emulated npu up
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)

    def save(n_embd: int) -> tuple[Any, str]:
        cfg = GPT2Config(
            n_layer=2,
            n_embd=n_embd,
            n_head=2,
            vocab_size=1000,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(cfg).eval()
        path = str(Path(root) / f"gpt2-{n_embd}")
        model.save_pretrained(path)
        return model, path

    tiny, tiny_path = save(64)  # ~0.7 MB of weights
    _, wide_path = save(256)  # ~7 MB of weights: more than npu:1's 4 MiB
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        cpu_loss = tiny(ids, labels=ids).loss.item()
    return Models(tiny, tiny_path, wide_path, ids, cpu_loss)


SPLIT = {
    "transformer.wte": 0,
    "transformer.wpe": 0,
    "transformer.drop": 0,
    "transformer.h.0": 0,
    "transformer.h.1": 1,
    "transformer.ln_f": 1,
    "lm_head": 0,
}


def test_split_gpt2_matches_cpu_loss_and_backpropagates(gpt2: Models) -> None:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map=SPLIT)
    devices = {n: str(p.device) for n, p in model.named_parameters()}
    assert devices["transformer.wte.weight"] == "npu:0", devices
    assert devices["transformer.h.1.mlp.c_fc.weight"] == "npu:1", devices
    assert set(devices.values()) == {"npu:0", "npu:1"}, devices
    assert torch.npu.memory_allocated(0) > 0 and torch.npu.memory_allocated(1) > 0
    out = model(gpt2.ids, labels=gpt2.ids)
    assert abs(out.loss.item() - gpt2.cpu_loss) < 1e-5, (out.loss.item(), gpt2.cpu_loss)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert grads["transformer.h.1.attn.c_attn.weight"].device == torch.device("npu:1")
    assert grads["transformer.wte.weight"].device == torch.device("npu:0")
    ref = GPT2LMHeadModel.from_pretrained(gpt2.tiny_path)
    ref.train(False)
    ref(gpt2.ids, labels=gpt2.ids).loss.backward()
    assert torch.allclose(
        grads["transformer.h.1.mlp.c_fc.weight"].cpu(), ref.transformer.h[1].mlp.c_fc.weight.grad, atol=1e-5
    )
    del model, out, grads
    gc.collect()


def test_overcommitted_device_map_fails_to_load_with_oom(gpt2: Models) -> None:
    from transformers import GPT2LMHeadModel

    base = torch.npu.memory_allocated(1)
    _free, total = torch.npu.mem_get_info(1)
    assert total == 4 * MIB, total
    try:
        GPT2LMHeadModel.from_pretrained(gpt2.wide_path, device_map={"": 1})
    except torch.OutOfMemoryError as e:
        assert "npu:1 has a total capacity of 4.00 MiB" in str(e), str(e)
    else:
        raise AssertionError("a 7 MB model loaded onto a 4 MiB device")
    gc.collect()
    assert torch.npu.memory_allocated(1) == base, "memory of the failed load was not returned"
    # The same model fits where the budget allows it.
    model = GPT2LMHeadModel.from_pretrained(gpt2.wide_path, device_map={"": 0})
    assert model.transformer.wte.weight.device == torch.device("npu:0")
    del model
    gc.collect()


def test_accelerate_sees_the_budgets(gpt2: Models) -> None:
    from accelerate.utils import get_max_memory

    budget = get_max_memory()
    assert 0 < budget[1] <= 4 * MIB and budget[0] > 4 * MIB, budget


def test_canary_seed_001_tied_weights_split_fails_at_index_select(gpt2: Models) -> None:
    """Seed 001: the tied pair wte/lm_head on different devices. Stock transformers does not
    keep tied parameters together when the device map separates them."""
    from transformers import GPT2LMHeadModel

    split = {
        "transformer.wte": 1,
        "transformer.wpe": 1,
        "transformer.drop": 1,
        "transformer.h": 1,
        "transformer.ln_f": 1,
        "lm_head": 0,
    }
    model = GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map=split)
    assert model.transformer.wte.weight is model.lm_head.weight, "weights are still tied after loading"
    try:
        model(gpt2.ids, labels=gpt2.ids)
    except RuntimeError as e:
        msg = str(e)
        assert SAME in msg and "index_select" in msg, msg
        assert "npu:0" in msg and "npu:1" in msg, msg
    else:
        raise AssertionError(
            CHANGED + "seed 001 no longer reproduces: a device map that puts transformer.wte on "
            "npu:1 and lm_head on npu:0 now runs with stock transformers/accelerate "
            f"(wte.weight on {model.transformer.wte.weight.device}). Update the canary."
        )
    del model
    gc.collect()


def test_canary_seed_002_int_device_turned_into_cuda_fails(gpt2: Models) -> None:
    """Seed 002: code with a hard-coded ladder turns an int device id into "cuda:<i>"."""
    from accelerate import infer_auto_device_map
    from transformers import GPT2LMHeadModel

    stock = infer_auto_device_map(gpt2.tiny)  # stock accelerate hands out int ids
    assert set(stock.values()) <= {0, 1, "cpu"} and any(isinstance(v, int) for v in stock.values()), stock
    laddered = {k: f"cuda:{v}" if isinstance(v, int) else v for k, v in stock.items()}
    try:
        GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map=laddered)
    except (AssertionError, RuntimeError) as e:
        assert cuda_refused(e), repr(e)
    else:
        raise AssertionError(CHANGED + "a 'cuda:<i>' device map now loads on a machine without CUDA")
    # transformers' own ladder: device_map="cuda" becomes "cuda:<LOCAL_RANK>".
    try:
        GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map="cuda")
    except (AssertionError, RuntimeError) as e:
        assert cuda_refused(e), repr(e)
    else:
        raise AssertionError(
            CHANGED + 'transformers no longer maps device_map="cuda" to "cuda:<LOCAL_RANK>" '
            "on a non-CUDA accelerator (seed 002's ladder). Update the canary."
        )


def kernelizes_by_default(gpt2: Models) -> bool:
    """Whether stock from_pretrained kernelizes a load nobody asked kernels for (transformers
    5.25 with the ``kernels`` package installed): read from what a cpu load reports."""
    from transformers import GPT2LMHeadModel

    return bool(GPT2LMHeadModel.from_pretrained(gpt2.tiny_path).use_kernels)


def test_plain_int_device_map_works_since_torch_2_13(gpt2: Models) -> None:
    """The case DESIGN.md records as fixed upstream: a bare int is the current accelerator
    (with kernels off: transformers 5.25's default kernelization is the canary below)."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map={"": 1}, use_kernels=False)
    assert model.transformer.wte.weight.device == torch.device("npu:1")
    ids = gpt2.ids.to("npu:1")  # one device: no dispatch hooks, inputs are the caller's job
    assert abs(model(ids, labels=ids).loss.item() - gpt2.cpu_loss) < 1e-5
    del model
    gc.collect()


def test_canary_default_kernelization_reads_an_int_device_map_value_as_a_device(gpt2: Models) -> None:
    """transformers 5.25 kernelizes every load by default once ``kernels`` is installed, and its
    hub_kernels.kernelize takes the first device-map value for a device: ``{"": 1}`` fails with
    "'int' object has no attribute 'type'" (on any accelerator; ``{"": 0}`` escapes only because
    0 is falsy). Releases that do not kernelize by default load it."""
    from transformers import GPT2LMHeadModel

    by_default = kernelizes_by_default(gpt2)
    try:
        model = GPT2LMHeadModel.from_pretrained(gpt2.tiny_path, device_map={"": 1})
    except AttributeError as e:
        assert by_default, f"{e!r} from a release that does not kernelize by default"
        assert "'int' object has no attribute 'type'" in str(e), repr(e)
        return
    assert not by_default, (
        CHANGED + 'transformers kernelizes by default and now loads device_map={"": 1}: the int '
        "qualification in accelreg's hub_kernels.kernelize seam may be unneeded now"
    )
    assert model.transformer.wte.weight.device == torch.device("npu:1")
    del model
    gc.collect()
