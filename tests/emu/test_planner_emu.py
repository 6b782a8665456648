"""The planner end to end on the emulated ``npu`` (3 devices): tiny GPT-2 and T5 planned with
``accelreg.plan_device_map`` under budgets that force a split, loaded through transformers with
that map, run forward and backward with the CPU loss. The same models with upstream's map
(accelerate's ``infer_auto_device_map``, same budgets as int ids) are recorded for comparison:
the test prints what upstream did, and asserts only what accelreg promises.

accelreg's integrations are not installed here (the plan is an explicit ``device_map``), except
in the last planning test, which shows the main device the planner chose (not the device of the
first module in forward order) running the offloaded blocks, with and without
``accelreg.install()``. One child process runs the module.
"""

from __future__ import annotations

import gc
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accelreg

pytestmark = [
    pytest.mark.emu,
    pytest.mark.filterwarnings("ignore"),
    pytest.mark.accelreg_emu(name="npu", devices=3, memory="64MiB,64MiB,64MiB", timeout=400),
]


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    importlib.import_module("torch_npu")  # the vendor package brings the emulated npu up
    torch.manual_seed(0)
    return torch.randint(0, 1000, (2, 12))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("planner-emu")


def gpt2() -> tuple[Any, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=4, n_embd=128, n_head=2, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel, cfg


def t5() -> tuple[Any, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        d_model=64,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        d_kv=32,
        vocab_size=1000,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5ForConditionalGeneration, cfg


def prepare(factory: Callable[[], tuple[Any, Any]], tmp: Path) -> tuple[Any, Any, str, Any, int]:
    cls, cfg = factory()
    model = cls(cfg).eval()
    path = str(tmp / cls.__name__)
    model.save_pretrained(path)
    with torch.device("meta"):
        meta = cls(cfg)
    total = sum(p.numel() * p.element_size() for p in meta.parameters())
    return cls, model, path, meta, total


def loss_and_grads(model: Any, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def run(factory: Callable[[], tuple[Any, Any]], ids: torch.Tensor, tmp: Path) -> dict[str, Any]:
    """Plan, load, train one step on the planned map; then upstream's map, recorded."""
    from accelerate import infer_auto_device_map

    cls, ref, path, meta, total = prepare(factory, tmp)
    ref_loss, ref_grads = loss_and_grads(ref, ids)
    budget = int(total * 0.45)  # no device holds half the model: at least three devices
    budgets = {f"npu:{i}": budget for i in range(3)}
    budgets["cpu"] = 10 * total
    plan = accelreg.plan_device_map(meta, budgets)
    accelreg.check_device_map(meta, plan, budgets)
    used = {d for d in plan.values() if d.startswith("npu")}
    assert len(used) >= 3 or (len(used) == 2 and "cpu" in plan.values()), plan
    model = cls.from_pretrained(path, device_map=plan)
    assert model.hf_device_map == plan
    devices = {str(p.device) for p in model.parameters()}
    assert len(devices & {"npu:0", "npu:1", "npu:2"}) >= 2, devices
    loss, grads = loss_and_grads(model, ids)
    assert set(grads) == set(ref_grads), set(ref_grads) ^ set(grads)
    for name, grad in grads.items():
        assert torch.allclose(grad.cpu(), ref_grads[name], atol=1e-5), name
    for i in range(3):
        assert torch.npu.memory_allocated(i) <= torch.npu.mem_get_info(i)[1]
    del model, grads
    gc.collect()
    # upstream, same budgets as int ids: recorded, not asserted
    upstream = infer_auto_device_map(
        meta,
        max_memory={0: budget, 1: budget, 2: budget, "cpu": 10 * total},
        no_split_module_classes=list(meta._no_split_modules or []),
    )
    record: dict[str, Any] = {
        "model": cls.__name__,
        "loss": loss,
        "cpu_loss": ref_loss,
        "npus_used": sorted(devices & {"npu:0", "npu:1", "npu:2"}),
        "accelreg": sorted(set(plan.values())),
        "upstream": sorted({str(v) for v in upstream.values()}),
    }
    try:
        accelreg.check_device_map(
            meta,
            {k: str(accelreg.resolve(v)) if isinstance(v, int) else v for k, v in upstream.items()},
            budgets,
        )
        record["upstream_check"] = "valid"
    except accelreg.DeviceMapError as exc:
        record["upstream_check"] = str(exc).splitlines()[0][:300]
    try:
        up = cls.from_pretrained(path, device_map=upstream)
        up_loss, _ = loss_and_grads(up, ids)
        record["upstream_loss_matches"] = abs(up_loss - ref_loss) < 1e-5
        del up
    except Exception as exc:  # noqa: BLE001 - recorded
        record["upstream_run"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    gc.collect()
    return record


@pytest.fixture(scope="module")
def planned(ids: torch.Tensor, tmp: Path) -> Callable[[Callable[[], tuple[Any, Any]]], dict[str, Any]]:
    """``planned(factory)``: :func:`run` for that model, once per child (its record after)."""
    records: dict[str, dict[str, Any]] = {}

    def get(factory: Callable[[], tuple[Any, Any]]) -> dict[str, Any]:
        if factory.__name__ not in records:
            records[factory.__name__] = run(factory, ids, tmp)
        return records[factory.__name__]

    return get


@pytest.mark.parametrize("factory", [gpt2, t5], ids=["gpt2", "t5"])
def test_planned_map_trains_with_the_cpu_loss(
    planned: Callable[..., dict[str, Any]], factory: Callable[[], tuple[Any, Any]]
) -> None:
    """Loaded on the planned map over at least two emulated npus, one step gives the cpu's loss
    (and the cpu's gradients: :func:`run` compares them parameter by parameter)."""
    record = planned(factory)
    assert len(record["npus_used"]) >= 2, record
    assert abs(record["loss"] - record["cpu_loss"]) < 1e-5, record


def test_a_chosen_main_device_runs_the_offloaded_blocks(ids: torch.Tensor, tmp: Path) -> None:
    # The tied embedding fills npu:0, so offloaded blocks can only run on npu:1: the planner
    # lists npu:1 first; accelerate runs the offloaded blocks there (given it explicitly on the
    # patch-free path, read from the map by accelreg's wrapper under install()).
    from accelerate import dispatch_model
    from transformers import GPT2Config, GPT2LMHeadModel

    import accelreg.integrations
    from accelreg.planner import plan

    cfg = GPT2Config(
        n_layer=5, n_embd=128, n_head=2, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    ref = GPT2LMHeadModel(cfg).eval()
    path = str(tmp / "gpt2-main")
    ref.save_pretrained(path)
    with torch.no_grad():
        ref_loss = ref(input_ids=ids, labels=ids).loss.item()
    with torch.device("meta"):
        meta = GPT2LMHeadModel(cfg)
    budgets = {"npu:0": 546792, "npu:1": 1587176, "npu:2": 1587176, "cpu": 10**8}
    result = plan(meta, budgets)
    device_map = result.device_map
    assert result.main_device == "npu:1" and next(iter(device_map.values())) == "npu:1", device_map
    assert device_map["transformer.wte"] == "npu:0" and "cpu" in device_map.values(), device_map
    accelreg.check_device_map(meta, device_map, budgets)

    def offloaded_run_on(model: Any) -> set[str]:
        hooks = [m._hf_hook for n, m in model.named_modules() if device_map.get(n) == "cpu"]
        assert hooks, "no offloaded module has a hook"
        return {str(h.execution_device) for h in hooks}

    # patch-free: accelerate picks list(set(...))[0] unless told, so tell it
    model = dispatch_model(
        GPT2LMHeadModel.from_pretrained(path).eval(), device_map, main_device=result.main_device
    )
    assert offloaded_run_on(model) == {"npu:1"}
    with torch.no_grad():
        assert abs(model(input_ids=ids, labels=ids).loss.item() - ref_loss) < 1e-5
    del model
    gc.collect()
    # under install(), from_pretrained's dispatch takes the map's first accelerator
    accelreg.install()
    try:
        model = GPT2LMHeadModel.from_pretrained(path, device_map=device_map).eval()
        assert offloaded_run_on(model) == {"npu:1"}
        with torch.no_grad():
            assert abs(model(input_ids=ids, labels=ids).loss.item() - ref_loss) < 1e-5
        del model
    finally:
        accelreg.integrations.uninstall()
    gc.collect()


def test_upstream_map_recorded_for_comparison(planned: Callable[..., dict[str, Any]]) -> None:
    """What accelerate's planner did with the same budgets (shown with ``-rP``)."""
    rows = [planned(gpt2), planned(t5)]
    assert [r["model"] for r in rows] == ["GPT2LMHeadModel", "T5ForConditionalGeneration"], rows
    for row in rows:
        print(json.dumps(row))
