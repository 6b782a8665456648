"""Seed 000 on the emulated npu *device* (``_seed_device.py``, one process).

* 8-bit: bitsandbytes cannot quantize 8-bit weights on a PrivateUse1 device whose runtime registers
  no shallow-copy override (its ``Int8Params`` swaps a cpu parameter's data for a device tensor,
  which torch refuses there; the emulator's override is turned off for this load). The bitsandbytes
  placement rule for the backend says so and ``from_pretrained`` is refused up front with a
  :class:`~accelreg.PlacementError`, before bitsandbytes runs.
* 4-bit, which bitsandbytes runs there: LoRA, Trainer + DeepSpeed (ZeRO-2 and ZeRO-3), the best
  checkpoint loaded at the end, its quantization state placed on ``npu:0``.
"""

from __future__ import annotations

from typing import Any

import pytest

from accelreg.errors import PlacementError
from accelreg.types import BackendSpec, PlacementRule

from .test_seed000 import _assert_loaded_best

pytestmark = pytest.mark.slow

DEVICE_STAGES = (2, 3)


@pytest.mark.emu
def test_8bit_on_the_device_is_refused_up_front(ds_helpers: Any) -> None:
    record = next(r for r in ds_helpers.seed_device().records if r.get("kind") == "refusal")
    assert record["device"] == "npu:0" and record["loaded"] is False, record
    assert record["exc_type"] == "PlacementError", record
    assert record["exc"].startswith(
        "bnb_8bit weights cannot be placed on 'npu': bitsandbytes cannot quantize"
    ), record
    assert "load in 4-bit" in record["exc"], record
    assert record["bitsandbytes_ran"] is False, "bitsandbytes ran before the refusal"


@pytest.mark.emu
@pytest.mark.parametrize("stage", DEVICE_STAGES)
def test_seed_4bit_on_the_npu_device(ds_helpers: Any, stage: int) -> None:
    run = ds_helpers.seed_device()
    run.done()
    record = run.find("trainer", [stage])
    assert record["wrapped"] == "DeepSpeedEngine" and record["device"] == "npu:0", record
    _assert_loaded_best(record)
    events = record["events"]
    assert events["n"] == 14 and events["devices"] == ["npu:0"] and events["methods"] == ["bnb_4bit"], events
    assert set(record["quant_devices"]) == {"npu:0"}, record["quant_devices"]


@pytest.mark.emu
def test_deepspeed_ran_on_accelregs_choice(ds_helpers: Any) -> None:
    done = ds_helpers.seed_device().done()
    report = done["accelerator"]
    assert done["ds"] == "npu" and report["agree"] and report["how"].startswith("handed over by accelreg"), (
        report
    )


def test_an_unsupported_rule_refuses_with_its_reason() -> None:
    """The contract the bitsandbytes rule uses, with an in-process plugin (no emulator)."""
    import types

    import accelreg

    plugin = types.SimpleNamespace(
        accelreg_backends=accelreg.hookimpl(
            lambda: [BackendSpec(name="acme", priority=1, is_available=lambda: False, device_count=lambda: 0)]
        ),
        accelreg_placement_rules=accelreg.hookimpl(
            lambda backend: (
                [
                    PlacementRule(
                        backend="acme",
                        quant_method="bnb_8bit",
                        module_classes=("bitsandbytes.nn.modules.Linear8bitLt",),
                        unsupported="the acme runtime has no int8 kernels",
                    )
                ]
                if backend == "acme"
                else []
            )
        ),
    )
    accelreg.register(plugin, "fakeplugin_acme")
    with pytest.raises(
        PlacementError, match="bnb_8bit weights cannot be placed on 'acme': the acme runtime has"
    ):
        accelreg.placement_rule("acme", "int8")
    assert accelreg.placement_rule("acme", "nf4").quant_method == "bnb_4bit"  # 4-bit stays allowed
    assert accelreg.placement_rule("cpu", "int8").unsupported == ""
