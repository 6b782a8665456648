"""Lightning's FSDP strategies on registry accelerators (issue 38): ``strategy="fsdp"``,
``FSDPStrategy(...)`` and ``ModelParallelStrategy`` (FSDP2, Lightning 2.4+), for the Trainer and
for Fabric, on the emulated ``npu`` (a name Lightning's registries do not have; accelreg registers
it) and ``emu`` (a name no library knows). Stock Lightning refuses them all: "The strategy `fsdp`
requires a GPU accelerator".

* the decision (default group): the Trainer and Fabric accept the FSDP strategies on a registry
  accelerator (``"auto"``, or the backend's name) under ``install()``, put rank r on
  ``<backend>:r``, and refuse them as stock Lightning does without it;
* the runs (slow group): ``_lightning_fsdp.py`` in two processes Lightning launches itself:
  rank r on ``<backend>:r`` over ``accelreg.dist_backend()``; the Trainer's checkpoint saved and
  restored (full state dict: one file; sharded: a folder) and resumed to the parameters of an
  uninterrupted run, which equal the same data-parallel training on the cpu; ``bf16-mixed``
  autocasting on the backend's device type; then Fabric saves (sharded or full), perturbs and
  loads its model back.

Each run is a script started in its own process group, which the test kills whatever happens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning tests need lightning (the lightning extra)")

from accelreg.testing.environ import emu_environ

from .._lightning import run_script, tiny

pytestmark = pytest.mark.emu

SCRIPT = Path(__file__).with_name("_lightning_fsdp.py")
COLLECTIVES = {"npu": "hccl", "emu": "emuccl"}
MOMENTUM = 0.9  # the script's optimizer: SGD(lr=0.1, momentum=0.9)


def _lightning_has_model_parallel() -> bool:
    import lightning

    return hasattr(lightning.pytorch.strategies, "ModelParallelStrategy")


# -- the decision -----------------------------------------------------------------------------
@pytest.fixture
def installed():
    from accelreg.integrations import lightning as ar_lightning

    ar_lightning.enable()
    yield
    ar_lightning.disable()


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.accelreg_emu(name=n, devices=2)) for n in COLLECTIVES],
)
@pytest.mark.parametrize("accelerator", ["auto", "named"])
def test_the_trainer_and_fabric_accept_fsdp_on_a_registry_accelerator(name, accelerator, installed):
    import lightning as L

    flag = name if accelerator == "named" else "auto"
    for strategy in ("fsdp", L.pytorch.strategies.FSDPStrategy()):
        trainer = L.Trainer(accelerator=flag, devices=2, strategy=strategy, logger=False)
        assert type(trainer.strategy).__name__ == "FSDPStrategy", trainer.strategy
        assert [str(d) for d in trainer.strategy.parallel_devices] == [f"{name}:0", f"{name}:1"]
    fabric_strategy = L.fabric.strategies.FSDPStrategy()
    for strategy in ("fsdp", fabric_strategy):
        fabric = L.Fabric(accelerator=flag, devices=2, strategy=strategy)
        assert type(fabric.strategy).__name__ == "FSDPStrategy", fabric.strategy
        assert str(fabric.strategy.root_device) == f"{name}:0"
    mixed = L.Trainer(accelerator=flag, devices=2, strategy="fsdp", precision="bf16-mixed", logger=False)
    with mixed.precision_plugin.forward_context():  # autocast on the backend's device type
        assert torch.is_autocast_enabled(name) and torch.get_autocast_dtype(name) == torch.bfloat16
    if _lightning_has_model_parallel():
        strategy = L.pytorch.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        trainer = L.Trainer(accelerator=flag, devices=2, strategy=strategy, logger=False)
        assert str(trainer.strategy.root_device) == f"{name}:0"


@pytest.mark.accelreg_emu(name="emu", devices=2)
def test_stock_lightning_refuses_fsdp_on_the_same_accelerator():
    """Without the integration the same Trainer and Fabric fail as Lightning says: the test above
    is the integration's doing."""
    import lightning as L

    from accelreg.integrations import lightning as ar_lightning
    from accelreg.integrations.lightning import RegistryAccelerator

    assert not ar_lightning.INTEGRATION.enabled
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    # Lightning 2.3+: "The strategy `fsdp` requires a GPU accelerator" (2.2: "... but GPU
    # accelerator is not used", a MisconfigurationException)
    with pytest.raises((ValueError, MisconfigurationException), match="GPU accelerator"):
        L.Trainer(accelerator=RegistryAccelerator("emu"), devices=2, strategy="fsdp", logger=False)
    with pytest.raises(ValueError, match="FSDP is only available on GPU"):
        L.Fabric(accelerator=RegistryAccelerator("emu"), devices=2, strategy="fsdp")


# -- the runs ----------------------------------------------------------------------------------
#: id -> (strategy spec, backend, accelerator flag, import name)
RUNS = {
    "fsdp-npu-auto": ("fsdp", "npu", "auto", "lightning"),
    "fsdp-emu-named": ("fsdp", "emu", "emu", "lightning"),
    "FSDPStrategy-npu-named-pytorch_lightning": ("FSDPStrategy", "npu", "npu", "pytorch_lightning"),
    "FSDPStrategy-emu-auto": ("FSDPStrategy", "emu", "auto", "lightning"),
    "ModelParallelStrategy-npu-auto": ("ModelParallelStrategy", "npu", "auto", "lightning"),
    "ModelParallelStrategy-emu-named": ("ModelParallelStrategy", "emu", "emu", "lightning"),
}
#: Whether each checkpoint is sharded (a folder), for the Trainer and for Fabric.
SHARDED = {"fsdp": (False, True), "FSDPStrategy": (True, False), "ModelParallelStrategy": (True, False)}


def _run(tmp_path: Path, spec: str, name: str, accelerator: str, import_name: str) -> dict[str, dict]:
    env = emu_environ(name, 2, OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
    return run_script(tmp_path, SCRIPT, [spec, accelerator, import_name], env, timeout=400)


def _same_training_on_the_cpu(batches0: list, batches1: list) -> list[list[float]]:
    """The two ranks' training in one cpu process: each step on both ranks' batches (FSDP
    averages the two ranks' gradients of their mean losses: the gradient of the mean over both)."""
    import lightning as L

    model = tiny(L)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM)
    for (x0, y0), (x1, y1) in zip(batches0, batches1, strict=True):
        x, y = torch.tensor(x0 + x1), torch.tensor(y0 + y1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x).float(), y).backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_fsdp_trains_rank_r_on_device_r_and_checkpoints_round_trip(tmp_path, run):
    spec, name, accelerator, import_name = RUNS[run]
    if import_name != "lightning":
        pytest.importorskip(import_name, reason="the standalone import name (pytorch-lightning)")
    if spec == "ModelParallelStrategy" and not _lightning_has_model_parallel():
        pytest.skip("ModelParallelStrategy (FSDP2) is in Lightning 2.4 and later")
    records = _run(tmp_path, spec, name, accelerator, import_name)
    trainer_sharded, fabric_sharded = SHARDED[spec]
    ranks = [records[f"trainer{r}"] for r in (0, 1)]
    expected = "ModelParallelStrategy" if spec == "ModelParallelStrategy" else "FSDPStrategy"
    for r, rec in enumerate(ranks):
        assert rec["strategy"] == expected and rec["accelerator"] == f"RegistryAccelerator[{name}]", rec
        device = f"{name}:{r}"
        assert rec["root_device"] == rec["input"] == rec["weight"] == rec["mixed_input"] == device, rec
        assert rec["local_devices"] == [device], rec
        assert rec["backend"] == rec["accelreg_backend"] == COLLECTIVES[name], rec
        assert rec["checkpoint_is_dir"] is trainer_sharded, rec
        assert rec["saved_step"] == 2 and rec["restored_equal"], rec
        assert rec["resumed_step"] == 4 and rec["resumed_params"] == rec["params"], "resume differs"
        assert rec["mixed_autocast"] is True and rec["mixed_matmul"] == "torch.bfloat16", rec
        assert rec["autocast"] is False, rec
    assert ranks[0]["params"] == ranks[1]["params"]
    cpu = _same_training_on_the_cpu(ranks[0]["batches"], ranks[1]["batches"])
    for mine, want in zip(ranks[0]["params"], cpu, strict=True):
        assert torch.allclose(torch.tensor(mine), torch.tensor(want), atol=1e-5), (mine, want)
    fabric = [records[f"fabric{r}"] for r in (0, 1)]
    for r, rec in enumerate(fabric):
        assert rec["strategy"] == expected and rec["device"] == f"{name}:{r}", rec
        assert rec["local_devices"] == [f"{name}:{r}"] and rec["backend"] == COLLECTIVES[name], rec
        assert rec["checkpoint_is_dir"] is fabric_sharded, rec
        assert rec["perturbed"] and rec["restored_equal"] and rec["remainder"] == {"step": 2}, rec
    assert fabric[0]["loss"] == fabric[1]["loss"]
