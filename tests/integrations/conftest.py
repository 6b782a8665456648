"""Fixtures of the integration tests: the libraries imported once, every integration disabled
after each test, strict mode, and the tiny models (built once per session)."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import accelreg
import accelreg.integrations as integrations

# The helpers import transformers, accelerate, peft, DeepSpeed and bitsandbytes or skip the
# importing test module; the fixtures import them when a test of the directory runs.


@pytest.fixture(scope="module", autouse=True)
def libraries():
    """Import every library, every seam module and every declared importer once, so that
    each snapshot sees the complete set of holders; and start with nothing enabled."""
    from ._support import NAMES, _integration

    integrations.uninstall()
    with warnings.catch_warnings():
        # bitsandbytes' import uses torch.jit.script_method (14 DeprecationWarnings of torch's,
        # none of the test's business)
        warnings.simplefilter("ignore", DeprecationWarning)
        import bitsandbytes  # noqa: F401
        import deepspeed  # noqa: F401 - its import is part of the state under test

        for name in NAMES:
            for seam in _integration(name).seams:
                for module in (seam.module, *seam.importers):
                    try:  # an importer of one release may not exist in another
                        importlib.import_module(module)
                    except ImportError:
                        pass
    yield
    integrations.uninstall()


@pytest.fixture(autouse=True)
def restored():
    """Every test leaves every integration disabled and nothing waiting for an import."""
    from ._support import NAMES, _integration

    yield
    integrations.uninstall()
    assert not any(_integration(n).enabled for n in NAMES)


@pytest.fixture
def strict():
    accelreg.configure(strict=True)
    yield
    accelreg.reset()


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """A tiny GPT-2 (tied wte/lm_head) and a tiny 12-layer Llama, saved once per session (read
    only: every module of the directory loads them)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from ._support import GPT2_KW

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**GPT2_KW)).save_pretrained(root / "gpt2")
    llama = LlamaConfig(
        num_hidden_layers=12,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=100,
        max_position_embeddings=32,
    )
    LlamaForCausalLM(llama).save_pretrained(root / "llama")
    return root


@pytest.fixture
def installed():
    from ._support import NAMES

    assert accelreg.install() == list(NAMES)
    yield


@pytest.fixture(scope="session")
def stock_tied_disk_offload(models, tmp_path_factory):
    """Why this transformers, stock, cannot load the tied wte/lm_head pair offloaded to disk
    (4.57.6 and 5.3.0: ``KeyError: 'lm_head.weight'``), or ``None`` where it loads it right. The
    disk-offload tests check accelreg's planning on top of upstream's offload: where upstream's
    own load fails they cannot pass, with accelreg or without."""
    from ._support import NAMES, _gpt2, _gpt2_map, _integration

    assert not any(_integration(n).enabled for n in NAMES)
    ids = torch.tensor([[1, 2, 3]])
    reference = _gpt2(models, device_map="cpu")(ids).logits
    tied_on_disk = _gpt2_map(**{"transformer.wte": "disk", "lm_head": "disk"})
    try:
        model = _gpt2(
            models, device_map=tied_on_disk, offload_folder=tmp_path_factory.mktemp("stock-offload")
        )
        got = model(ids).logits
    except Exception as exc:  # noqa: BLE001 - the outcome is the answer
        return f"{type(exc).__name__}: {exc}"
    return None if torch.equal(got, reference) else "the logits differ from the cpu load's"
