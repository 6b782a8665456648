"""Lightning trains on the emulated accelerator: the Trainer and Fabric under ``npu`` and ``mlu``
(two emulated devices each), with ``accelreg.install()``'s integration and with the explicit
``RegistryAccelerator`` alone.

* ``accelerator="auto"`` and the backend's name train on the device (stock Lightning: the cpu,
  or "invalid accelerator name"); ``bf16-mixed`` computes the matmuls in bfloat16 there;
* ``RegistryAccelerator()`` without ``install()``: the Trainer trains on the device;
* Fabric: ``fabric.device`` is the device, its autocast runs in bfloat16 there;
* a checkpoint saved on the device and resumed with ``ckpt_path`` gives the parameters of an
  uninterrupted run;
* two processes that Lightning launches itself (``ddp``): rank r on device r over
  ``accelreg.dist_backend()``, equal parameters, the loss of the same training on the cpu within
  1e-4; then Fabric in the same two processes: each rank's device and its collectives.

Each test class runs in one child pytest per backend (the ``accelreg_emu`` marker); the DDP
runs are a script started in its own process group, which the test kills whatever happens.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning tests need lightning (the lightning extra)")

from accelreg.integrations import lightning as ar_lightning
from accelreg.integrations.lightning import RegistryAccelerator
from accelreg.testing.environ import emu_environ

from .._lightning import QUIET, data, params, run_script, tiny

pytestmark = [pytest.mark.slow, pytest.mark.emu]

DDP_SCRIPT = Path(__file__).with_name("_lightning_ddp.py")
DEEPSPEED_SCRIPT = Path(__file__).with_name("_lightning_deepspeed.py")


@pytest.fixture
def installed():
    """The Lightning integration on for the test (``install()``'s effect in this process)."""
    ar_lightning.enable()
    yield
    ar_lightning.disable()


def _here() -> str:
    return os.environ["ACCELREG_EMU_NAME"]


def _fit(accelerator, **kw):
    import lightning as L

    model = tiny(L)
    kw.setdefault("max_steps", 2)
    trainer = L.Trainer(accelerator=accelerator, devices=kw.pop("devices", 1), **QUIET, **kw)
    trainer.fit(model, data())
    return trainer, model


BACKENDS = [
    pytest.param("npu", marks=pytest.mark.accelreg_emu(name="npu", devices=2)),
    pytest.param("mlu", marks=pytest.mark.accelreg_emu(name="mlu", devices=2)),
]


@pytest.mark.parametrize("name", BACKENDS)
def test_auto_and_the_backend_name_train_on_the_device_in_bf16(name, installed):
    assert _here() == name
    for accelerator in ("auto", name):
        trainer, model = _fit(accelerator, precision="bf16-mixed")
        assert isinstance(trainer.accelerator, RegistryAccelerator), accelerator
        assert trainer.strategy.root_device == torch.device(name, 0)
        assert model.seen["input"] == model.seen["weight"] == torch.device(name, 0), model.seen
        assert model.seen["matmul"] == torch.bfloat16  # computed in bf16 on the device
    trainer, model = _fit(name, devices="1,")
    assert model.seen["weight"] == torch.device(name, 1) and model.seen["matmul"] == torch.float32


@pytest.mark.accelreg_emu(name="npu", devices=2)
def test_the_explicit_accelerator_trains_on_the_device_without_install():
    name = "npu"
    assert not ar_lightning.INTEGRATION.enabled
    trainer, model = _fit(RegistryAccelerator(), precision="bf16-mixed")
    assert trainer.accelerator.backend == name
    assert model.seen["input"] == model.seen["weight"] == torch.device(name, 0), model.seen
    assert model.seen["matmul"] == torch.bfloat16
    # Lightning's teardown moves the model back to the cpu; Parameter identity across .to()
    # (as on CUDA) frees its device memory, so the stats see a tensor held here
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    held = torch.ones(1024, device=torch.device(name, 0))
    stats = trainer.accelerator.get_device_stats(torch.device(name, 0))
    assert stats["memory.total_bytes"] > 0 and stats["memory.allocated_bytes"] >= held.nbytes


@pytest.mark.accelreg_emu(name="npu", devices=2)
def test_fabric_runs_on_the_device_and_autocasts_there(installed):
    import lightning as L

    name = "npu"
    fabric = L.Fabric(accelerator="auto", devices=1, precision="bf16-mixed")
    assert fabric.device == torch.device(name, 0)
    model = fabric.setup_module(tiny(L))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = next(iter(data()))
    loss = torch.nn.functional.mse_loss(model(fabric.to_device(x)), fabric.to_device(y))
    fabric.backward(loss)
    optimizer.step()
    seen = model.module.seen
    assert seen["input"] == seen["weight"] == torch.device(name, 0) and seen["matmul"] == torch.bfloat16


@pytest.mark.accelreg_emu(name="npu", devices=2)
def test_fabric_setup_with_the_optimizer_built_first_trains_the_moved_parameters(installed):
    """``fabric.setup(model, optimizer)`` with the optimizer made before the model moves: the
    emulator keeps Parameter identity across ``module.to(device)``, as CUDA and torch_npu do, so
    the optimizer steps the parameters on the device (new Parameters would leave it stepping
    stale cpu copies while the model never changes)."""
    import lightning as L

    reference = tiny(L)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = tiny(L)
    held = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fabric = L.Fabric(accelerator="npu", devices=1)
    wrapped, optimizer = fabric.setup(model, optimizer)
    assert all(a is b for a, b in zip(held, wrapped.parameters(), strict=True))
    assert {p.device for p in wrapped.parameters()} == {torch.device("npu", 0)}
    for x, y in data():
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(wrapped(fabric.to_device(x)), fabric.to_device(y)))
        optimizer.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
    got, want = params(wrapped), params(reference)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want, strict=True)), (got, want)


@pytest.mark.accelreg_emu(name="npu", devices=2)
def test_the_standalone_import_name_trains_on_the_device_too():
    pl = pytest.importorskip("pytorch_lightning", reason="the standalone import name (pytorch-lightning)")
    from accelreg.integrations.lightning import pytorch_lightning as ar_pl

    ar_pl.enable()
    try:
        model = tiny(pl)
        trainer = pl.Trainer(accelerator="npu", devices=1, max_steps=2, precision="bf16-mixed", **QUIET)
        trainer.fit(model, data())
    finally:
        ar_pl.disable()
    assert model.seen["weight"] == torch.device("npu", 0) and model.seen["matmul"] == torch.bfloat16


@pytest.mark.accelreg_emu(name="npu", devices=2)
def test_a_checkpoint_saved_on_the_device_resumes_to_the_same_parameters(installed, tmp_path):
    import lightning as L

    _, straight = _fit("npu", max_epochs=2, max_steps=-1)
    trainer, _ = _fit("npu", max_epochs=1, max_steps=-1)
    path = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 4 and "optimizer_states" in saved
    resumed = tiny(L)
    again = L.Trainer(accelerator="npu", devices=1, max_epochs=2, **QUIET)
    again.fit(resumed, data(), ckpt_path=path)
    assert again.global_step == 8 and resumed.seen["weight"] == torch.device("npu", 0)
    assert all(torch.equal(a, b) for a, b in zip(params(resumed), params(straight), strict=True))


# -- two processes, launched by Lightning -----------------------------------------------------------
def _run_ddp(tmp_path: Path, strategy: str, script: Path = DDP_SCRIPT, *args: str) -> dict[str, dict]:
    """Run the DDP script in its own process group; the group (Lightning's children included)
    is killed when it is done, however it ends."""
    env = emu_environ("npu", 2, OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
    return run_script(tmp_path, script, [strategy, *args], env, timeout=300)


def _same_training_on_the_cpu(batches0: list, batches1: list) -> tuple[list[torch.Tensor], float]:
    """The DDP run in one cpu process: each step on both ranks' batches (DDP averages the two
    ranks' gradients of their mean losses: the gradient of the mean over both batches)."""
    import lightning as L

    model = tiny(L)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x0, y0), (x1, y1) in zip(batches0, batches1, strict=True):
        x, y = torch.tensor(x0 + x1), torch.tensor(y0 + y1)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        optimizer.step()
    return params(model), float(loss)


def test_ddp_puts_rank_r_on_device_r_and_matches_the_cpu_then_fabric_joins(tmp_path):
    """Lightning's subprocess launcher (``ddp``). ``ddp_spawn`` runs the same script
    (``python tests/emu/_lightning_ddp.py OUT ddp_spawn``); it is not run here, for time: two more
    interpreters importing Lightning, and what it adds — the accelerator pickled to the spawned
    processes — is tested in tests/test_lightning.py."""
    strategy = "ddp"
    records = _run_ddp(tmp_path, strategy)
    ranks = [records[f"trainer{r}"] for r in (0, 1)]
    for r, rec in enumerate(ranks):
        assert rec["root_device"] == rec["input"] == rec["weight"] == f"npu:{r}", rec
        assert rec["backend"] == rec["accelreg_backend"] == "hccl"  # the emulated npu's collectives
    assert ranks[0]["params"] == ranks[1]["params"]
    cpu_params, cpu_loss = _same_training_on_the_cpu(ranks[0]["batches"], ranks[1]["batches"])
    for mine, cpu in zip(ranks[0]["params"], cpu_params, strict=True):
        assert torch.allclose(torch.tensor(mine), cpu.flatten(), atol=1e-5)
    assert abs(ranks[0]["loss"] - cpu_loss) < 1e-4 and ranks[0]["loss"] == ranks[1]["loss"]
    fabric = [records[f"fabric{r}"] for r in (0, 1)]
    for r, rec in enumerate(fabric):
        assert rec["device"] == rec["all_reduce_device"] == f"npu:{r}" and rec["backend"] == "hccl"
        assert rec["all_reduce"] == 3.0 and rec["all_gather"] == [0, 10] and rec["broadcast"] == [7.0]


@pytest.mark.parametrize(
    ("strategy", "stage", "import_name"),
    [("deepspeed_stage_2", 2, "lightning"), ("deepspeed_stage_3", 3, "pytorch_lightning")],
)
def test_deepspeed_zero_trains_rank_r_on_device_r_saves_and_resumes_then_fabric(
    tmp_path, strategy, stage, import_name
):
    """Lightning's DeepSpeed strategies (stock: "only supported on CUDA GPUs") on two emulated
    npus, under both import names: rank r on npu:r, the process group over the registry's
    collectives, ZeRO stage as asked, the parameters of the same data-parallel training on the
    cpu; a checkpoint (DeepSpeed's folder) restores exactly and resumes to the parameters of an
    uninterrupted run. Then Fabric with the same strategy, ``setup(model, optimizer)`` with the
    optimizer built first, trains on each rank's npu."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the [deepspeed] extra")
    if import_name != "lightning":
        pytest.importorskip(import_name, reason="the standalone import name (pytorch-lightning)")
    records = _run_ddp(tmp_path, strategy, DEEPSPEED_SCRIPT, import_name)
    ranks = [records[f"trainer{r}"] for r in (0, 1)]
    cpu, _ = _same_training_on_the_cpu(ranks[0]["batches"], ranks[1]["batches"])
    for r, rec in enumerate(ranks):
        assert rec["strategy"] == "DeepSpeedStrategy" and rec["zero_stage"] == stage, rec
        assert rec["root_device"] == rec["input"] == rec["engine_device"] == f"npu:{r}", rec
        assert rec["backend"] == rec["accelreg_backend"] == "hccl", rec
        assert rec["checkpoint_is_dir"] and rec["saved_step"] == 2 and rec["restored_equal"], rec
        assert rec["resumed_step"] == 4 and rec["resumed_params"] == rec["params"], "resume differs"
        for mine, want in zip(rec["params"], cpu, strict=True):
            assert torch.allclose(torch.tensor(mine), want.flatten(), atol=1e-5), (mine, want)
    fabric = [records[f"fabric{r}"] for r in (0, 1)]
    for r, rec in enumerate(fabric):
        assert rec["device"] == rec["engine_device"] == f"npu:{r}" and rec["backend"] == "hccl", rec
    assert fabric[0]["loss"] == fabric[1]["loss"]
