"""On the emulated accelerator (accelreg-emu presenting itself as Ascend ``npu``, 2 devices).

Both tests run in one child ``pytest`` process started by the ``accelreg_emu`` marker.

* A checkpoint held on the CPU (as DeepSpeed always loads it) restored into bitsandbytes
  layers living on ``npu:1``: the travelling keys land on ``npu:1`` before bitsandbytes' loader
  runs, every quantized tensor comes back bit for bit, and the forward pass on ``npu:1`` is
  unchanged. bitsandbytes runs there through its device-independent (pure torch) kernels.
  ``Module.to("npu:1")`` cannot move a bitsandbytes layer under the emulator (torch's
  ``_has_compatible_shallow_copy_type`` counts PrivateUse1 tensors as incompatible with CPU
  ones, so ``Int8Params``/``Params4bit`` cannot be re-created), so the layers are placed on
  ``npu:1`` by hand, as bitsandbytes itself lays them out.
* DeepSpeed gets the registry's choice: the cpu when the user disabled npu through accelreg
  (:func:`accelreg.integrations.deepspeed.prepare`, before DeepSpeed first picks), DeepSpeed's
  own npu class by default (``enable()``), and accelreg's registry accelerator answers from the
  emulated ``torch.npu`` too.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.accelreg_emu(name="npu", devices=2, OMP_NUM_THREADS="1", timeout=400),
]


def _layers() -> Any:
    """An 8-bit and a 4-bit (nested nf4) bitsandbytes layer, quantized, placed on npu:1."""
    import bitsandbytes as bnb
    import bitsandbytes.nn.modules as modules
    import torch
    from bitsandbytes.nn.modules import Int8Params, Params4bit

    modules.has_avx512bf16 = lambda: False
    dev = torch.device("npu:1")
    torch.manual_seed(0)
    fp = torch.nn.Linear(64, 64)
    l8 = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False)
    l8.load_state_dict(fp.state_dict())
    l8 = l8.to("cpu")  # quantizes
    w = l8.weight
    p8 = Int8Params(w.data.to(dev), requires_grad=False, has_fp16_weights=False)
    p8.CB, p8.SCB = p8.data, w.SCB.to(dev)
    l8._parameters["weight"] = p8
    l8._parameters["bias"] = torch.nn.Parameter(l8.bias.data.to(dev))
    l4 = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.float32, compress_statistics=True, quant_type="nf4")
    l4.load_state_dict(fp.state_dict())
    l4 = l4.to("cpu")
    qs = l4.weight.quant_state
    qs.to(dev)  # in place
    p4 = Params4bit(
        l4.weight.data.to(dev),
        requires_grad=False,
        quant_state=qs,
        blocksize=qs.blocksize,
        compress_statistics=True,
        quant_type="nf4",
        bnb_quantized=True,
        module=l4,
    )
    l4._parameters["weight"] = p4
    l4.quant_state = qs
    l4._parameters["bias"] = torch.nn.Parameter(l4.bias.data.to(dev))
    model = torch.nn.Sequential(l8, torch.nn.ReLU(), l4)
    model.requires_grad_(False)
    return model


def _quantized(model: Any) -> dict[str, Any]:
    l8, l4 = model[0], model[2]
    qs = l4.weight.quant_state
    return {
        "0.weight": l8.weight.data,
        "0.SCB": l8.weight.SCB if l8.weight.SCB is not None else l8.state.SCB,
        "0.state.CB": l8.state.CB,
        "2.weight": l4.weight.data,
        "2.absmax": qs.absmax,
        "2.code": qs.code,
        "2.nested_absmax": qs.state2.absmax,
        "2.nested_code": qs.state2.code,
        "2.offset": qs.offset,
    }


def _corrupt(model: Any) -> None:
    import torch

    l8, l4 = model[0], model[2]
    with torch.no_grad():
        l8.weight.data.neg_()
        l8.state.SCB.mul_(3.0)
        l4.weight.data.bitwise_xor_(0x5A)
        qs = l4.weight.quant_state
        qs.absmax.add_(7)
        qs.state2.absmax.mul_(3.0)
        qs.offset.add_(1.0)


def test_cpu_checkpoint_restored_onto_npu1() -> None:
    import torch
    import torch_npu  # noqa: F401 - brings the emulated npu up, as the real package would
    from torch.overrides import TorchFunctionMode

    import accelreg
    from accelreg import placement

    assert accelreg.current_backend().name == "npu" and accelreg.device_count() == 2
    dev = torch.device("npu:1")
    model = _layers()
    x = torch.randn(3, 64).to(dev)
    with torch.no_grad():
        y0 = model(x)  # first forward: bitsandbytes moves SCB from weight.SCB to state.SCB
    assert y0.device == dev and model[0].weight.SCB is None and model[0].state.SCB.device == dev
    saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # DeepSpeed: on the cpu
    reference = {k: v.detach().cpu().clone() for k, v in _quantized(model).items()}

    # upstream first (no hooks): the 8-bit layer refuses, as in seed 000
    _corrupt(model)
    with pytest.raises(RuntimeError, match="Loading a quantized checkpoint into non-quantized Linear8bitLt"):
        model.load_state_dict(saved)
    _corrupt(model)

    assert placement.attach(model) == {"bnb_8bit": 1, "bnb_4bit": 1}
    seen: dict[str, str] = {}

    def spy(module: Any, state_dict: dict[str, Any], prefix: str, *rest: Any) -> None:
        # registered last: runs after accelreg's pre-hook, just before the module's own loader
        seen.update({k: str(v.device) for k, v in state_dict.items() if k.startswith(prefix)})

    for layer in (model[0], model[2]):
        layer.register_load_state_dict_pre_hook(spy)

    class MoveLog(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.targets: set[str] = set()

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.to:
                self.targets.update(
                    str(a) for a in (*args[1:], *kwargs.values()) if isinstance(a, (torch.device, str))
                )
            return func(*args, **kwargs)

    with MoveLog() as log:
        result = model.load_state_dict(saved, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert log.targets <= {"npu:1"}, log.targets
    # the travelling keys were on npu:1 when bitsandbytes' loader ran; the bias did not travel
    assert seen["0.weight"] == seen["0.SCB"] == "npu:1" and seen["0.bias"] == "cpu", seen
    assert seen["2.weight"] == "npu:1" and seen["2.bias"] == "cpu", seen
    assert "0.weight_format" not in seen and not any(k.startswith("2.weight.") for k in seen), seen
    events = placement.load_events(model)
    assert [e["device"] for e in events] == ["npu:1", "npu:1"], events
    live = _quantized(model)
    for key, value in live.items():
        assert value.device == dev, f"{key} left {dev}: {value.device}"
        assert torch.equal(value.cpu(), reference[key]), f"{key} not restored bit for bit"
    assert model[0].weight.SCB is None and model[2].quant_state is model[2].weight.quant_state
    with torch.no_grad():
        y1 = model(x)
    assert torch.equal(y1.cpu(), y0.cpu())

    # frozen weights excluded (Trainer's DeepSpeed checkpoints): state restored on npu:1, weight kept
    _corrupt(model)
    weightless = {k: v for k, v in saved.items() if k not in ("0.weight", "2.weight")}
    result = model.load_state_dict(weightless, strict=False)
    assert sorted(result.missing_keys) == ["0.weight", "2.weight"] and not result.unexpected_keys
    live = _quantized(model)
    for key in ("0.SCB", "2.absmax", "2.nested_absmax", "2.offset"):
        assert live[key].device == dev and torch.equal(live[key].cpu(), reference[key]), key
    notes = [e.get("note", "") for e in placement.load_events(model)[-2:]]
    assert all("lacks" in n for n in notes), notes


def test_deepspeed_gets_the_registrys_accelerator_on_npu() -> None:
    import sys

    import torch
    import torch_npu  # noqa: F401

    import accelreg
    from accelreg.integrations import deepspeed as integration

    assert "deepspeed" not in sys.modules
    report = integration.accelerator_report()
    assert report["deepspeed"] == "npu" and report["implementation"] == "DeepSpeed's own npu class", report
    assert report["collectives"] == "hccl" and report["agree"], report
    # the user chose the cpu through accelreg (npu disabled): DeepSpeed gets it from its first pick
    accelreg.configure(disable=["npu"])
    integration.prepare()
    import deepspeed  # noqa: F401
    from deepspeed.accelerator import get_accelerator, real_accelerator

    assert get_accelerator()._name == "cpu" and "DS_ACCELERATOR" not in os.environ
    assert integration.accelerator_report()["how"] == "handed over by accelreg (the registry chose cpu)"
    # the default order again: enable() hands DeepSpeed the npu, disable() takes it back
    accelreg.reset()
    integration.enable()
    try:
        npu = get_accelerator()
        assert type(npu).__name__ == "NPU_Accelerator" and npu.device_name(1) == "npu:1"
        assert npu.communication_backend_name() == accelreg.dist_backend() == "hccl"
        assert integration.accelerator_report()["agree"]
        # DeepSpeed's launcher on another node: accelreg's variables travel with its exports ...
        assert "ACCELREG_RUN" in npu.export_envs() and "ASCEND" in npu.export_envs()
        # ... and a node's inherited mask (accelreg run --devices 1) keeps its device: slot 0 is
        # physical 1, where DeepSpeed's class alone would write ASCEND_RT_VISIBLE_DEVICES=0
        env = {"ASCEND_RT_VISIBLE_DEVICES": "1"}
        npu.set_visible_devices_envs(env, [0])
        assert env == {"ASCEND_RT_VISIBLE_DEVICES": "1"}
        env = {}
        npu.set_visible_devices_envs(env, [1, 0])
        assert env == {"ASCEND_RT_VISIBLE_DEVICES": "1,0"}  # no mask: slots are physical ids
        with pytest.raises(accelreg.DeviceError, match="slots are positions in that mask"):
            npu.set_visible_devices_envs({"ASCEND_RT_VISIBLE_DEVICES": "1"}, [1])
    finally:
        integration.disable()
    assert real_accelerator.ds_accelerator is None, "disable() did not restore DeepSpeed's own state"

    # accelreg's registry accelerator on the same devices (the benchmark's contender)
    acc = integration.registry_accelerator()
    assert type(acc).__name__ == "RegistryAccelerator" and acc.backend == "npu"
    assert (
        acc.device_count() == 2 and acc.device_name(1) == "npu:1" and acc.device(1) == torch.device("npu:1")
    )
    assert acc.total_memory(1) == torch.npu.mem_get_info(1)[1]
    assert acc.FloatTensor([1.0]).device == torch.device("npu:0")
    acc.set_device(1)
    try:
        assert acc.current_device() == 1 and acc.current_device_name() == "npu:1"
        x = torch.ones(1024, device="npu:1")
        assert acc.memory_allocated(1) >= x.numel() * 4 and acc.on_accelerator(x)
        event = acc.Event()
        event.record(acc.current_stream())
        acc.synchronize()
    finally:
        acc.set_device(0)
    assert acc.visible_devices_envs() == ["ASCEND_RT_VISIBLE_DEVICES"]
    accelreg.reset()
