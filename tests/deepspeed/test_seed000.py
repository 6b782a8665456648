"""Seed 000 through Trainer: DeepSpeed + bitsandbytes 8-bit + LoRA, load_best_model_at_end.

Upstream (transformers 5.24, deepspeed 0.19.8, bitsandbytes 0.50.2, peft 0.21.2) every ZeRO
stage trains to the end and then crashes in ``Trainer._load_best_model`` →
``engine.load_checkpoint`` → ``Linear8bitLt._load_from_state_dict``. With ``accelreg.install()``
(the only change to the seed's script) it completes, and the loaded LoRA weights are the best
checkpoint's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import STAGES

pytestmark = pytest.mark.slow

UPSTREAM_ERROR = (
    "Loading a quantized checkpoint into non-quantized Linear8bitLt is not supported. "
    "Please call module.cuda() before module.load_state_dict()"
)


def _assert_loaded_best(record: dict[str, Any]) -> None:
    assert record["ok"], f"train() raised {record.get('exc_type')}: {record.get('exc')}\n" + "\n".join(
        record.get("frames", [])
    )
    adapter = record["adapter"]
    assert adapter["best"] == "checkpoint-2" and adapter["last"] == "checkpoint-6", adapter
    assert adapter["best_differs_from_last"], (
        "the best and the last adapter are equal: the load proves nothing"
    )
    assert adapter["lora_equal"] == adapter["lora_n"] == 8, (
        f"LoRA matrices differ from the best checkpoint: {adapter}"
    )
    assert record["eval_after_load"] == record["best_metric"], (
        f"eval after the load {record['eval_after_load']} != best_metric {record['best_metric']}"
    )


def _assert_quantized_state_loaded(record: dict[str, Any]) -> None:
    adapter, events = record["adapter"], record["events"]
    assert adapter["scb_equal"] == adapter["scb_n"] == 14, adapter  # live SCB == the DeepSpeed module file
    # 14 quantized layers; the checkpoint (exclude_frozen_parameters=True) lacks their int8 weights
    assert events["n"] == 14 and events["param_missing"] == 14 and events["devices"] == ["cpu"], events
    assert events["methods"] == ["bnb_8bit"] and events["notes"] == ["the checkpoint "], events


@pytest.mark.parametrize("stage", STAGES)
def test_canary_upstream_still_fails(ds_helpers: Any, stage: int) -> None:
    run = ds_helpers.run("none")
    assert run.done()["accelreg_imported"] is False
    record = run.find("trainer", [stage])
    if record["ok"]:
        pytest.fail(
            f"upstream changed: seed 000 no longer reproduces (ZeRO-{stage} loaded the best checkpoint "
            "without accelreg); re-check the bitsandbytes/DeepSpeed/transformers versions and what "
            "accelreg's placement hooks are still needed for",
            pytrace=False,
        )
    assert record["exc_type"] == "RuntimeError" and record["exc"] == UPSTREAM_ERROR, record
    frames = " | ".join(record["frames"])
    for where in ("deepspeed/runtime/engine.py", "load_module_state_dict", "bitsandbytes/nn/modules.py"):
        assert where in frames, f"upstream changed: the error now comes from elsewhere: {frames}"
    assert record["frames"][-1].endswith("_load_from_state_dict"), frames
    assert len(record["evals"]) == 3, "training did not reach the end before the load"


def test_control_without_deepspeed_passes_upstream(ds_helpers: Any) -> None:
    record = ds_helpers.run("none").find("trainer", [])
    assert record["launcher_vars"] == [] and record["wrapped"] != "DistributedDataParallel", record
    _assert_loaded_best(record)


def test_control_without_deepspeed_passes_with_install(ds_helpers: Any) -> None:
    record = ds_helpers.run("install").find("trainer", [])
    assert record["launcher_vars"] == [] and record["wrapped"] != "DistributedDataParallel", record
    _assert_loaded_best(record)


@pytest.mark.parametrize("stage", STAGES)
def test_seed_with_install(ds_helpers: Any, stage: int) -> None:
    run = ds_helpers.run("install")
    run.done()
    record = run.find("trainer", [stage])
    assert record["wrapped"] == "DeepSpeedEngine", record
    _assert_loaded_best(record)
    _assert_quantized_state_loaded(record)


@pytest.mark.parametrize("stage", STAGES)
def test_seed_with_the_deepspeed_integration_only(ds_helpers: Any, stage: int) -> None:
    """Only ``accelreg.integrations.deepspeed.enable()``: Trainer reaches ``deepspeed.initialize``
    through accelerate (looked up at call time), and the seam attaches the hooks there."""
    run = ds_helpers.run("deepspeed")
    run.done()
    record = run.find("trainer", [stage])
    assert record["attached_before_trainer"] == 0, "something other than the DeepSpeed seam attached hooks"
    assert record["attached_after"] == 14, record
    _assert_loaded_best(record)
    _assert_quantized_state_loaded(record)
