"""Lightning on this CPU machine (real Lightning, no mocks of it): ``RegistryAccelerator``'s
device parsing and errors, both import names, and what ``enable()`` changes — checked on scripted
backends torch knows as device types (``xpu``, ``hpu``), whose Trainer and Fabric objects are
built but never run (there is no runtime). Training on devices is in
``tests/emu/test_lightning_emu.py``.
"""

from __future__ import annotations

import pickle

import pytest
import torch

L = pytest.importorskip("lightning", reason="the Lightning tests need lightning (the lightning extra)")

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY  # noqa: E402
from lightning.pytorch.accelerators import AcceleratorRegistry, CPUAccelerator  # noqa: E402

import accelreg  # noqa: E402
from accelreg import DeviceError  # noqa: E402
from accelreg.integrations import lightning as ar_lightning  # noqa: E402
from accelreg.integrations.lightning import RegistryAccelerator  # noqa: E402
from accelreg.integrations.lightning import fabric as ar_fabric  # noqa: E402
from accelreg.integrations.lightning import pytorch_lightning as ar_pl  # noqa: E402

from ._fakes import plugin, spec  # noqa: E402
from ._lightning import QUIET, data, params, tiny  # noqa: E402

ALL = (ar_lightning, ar_fabric, ar_pl)


@pytest.fixture(autouse=True)
def disabled():
    """Every test ends with the three Lightning integrations disabled."""
    yield
    for integration in ALL:
        integration.disable()


def _xpu(count: int = 3, **kw):
    """A scripted backend on a device type torch knows without a runtime."""
    kw.setdefault("dist_backend", "fakeccl")
    return spec("xpu", count, priority=200, **kw)


def _registries():
    return {
        id(r): dict((name, dict.get(r, name)) for name in r)  # the entries themselves, by identity
        for r in (AcceleratorRegistry, ACCELERATOR_REGISTRY)
    }


# -- RegistryAccelerator, no install() --------------------------------------------------------
def test_device_parsing_follows_lightning_and_names_what_exists():
    accelreg.register(plugin(_xpu()), "fakeplugin_xpu")
    acc = RegistryAccelerator("xpu")
    cls = type(acc)
    assert isinstance(acc, RegistryAccelerator) and acc.backend == "xpu" and cls.name() == "xpu"
    assert cls.is_available() and cls.auto_device_count() == 3
    assert cls.parse_devices(2) == [0, 1] and cls.parse_devices("2") == [0, 1]
    assert cls.parse_devices(-1) == cls.parse_devices("-1") == [0, 1, 2]
    assert cls.parse_devices("1,") == [1] and cls.parse_devices("0, 2") == [0, 2]
    assert cls.parse_devices([2, 0]) == [2, 0]
    assert cls.get_parallel_devices([0, 2]) == [torch.device("xpu", 0), torch.device("xpu", 2)]
    with pytest.raises(DeviceError, match=r"asks for \['xpu:3'\]: xpu has 3 devices \(xpu:0, xpu:1, xpu:2\)"):
        cls.parse_devices([3])
    with pytest.raises(DeviceError, match=r"devices=4 asks for \['xpu:3'\]"):
        cls.parse_devices(4)
    with pytest.raises(DeviceError, match="repeats a device"):
        cls.parse_devices([1, 1])
    with pytest.raises(DeviceError, match="asks for no device"):
        cls.parse_devices(0)
    with pytest.raises(DeviceError, match="comma-separated list of indices"):
        cls.parse_devices("one")
    with pytest.raises(TypeError, match="is a bool"):
        cls.parse_devices(True)
    stats = acc.get_device_stats("xpu:1")  # the plugin's memory_info: 2 GiB free of 3 GiB
    assert stats["memory.free_bytes"] == 2 << 30 and stats["memory.total_bytes"] == 3 << 30
    assert stats["memory.used_bytes"] == 1 << 30


def test_backends_without_indices_and_the_cpu_count_processes():
    hpu = spec("hpu", 2, priority=200, indexed=False, device=lambda i: torch.device("hpu"))
    accelreg.register(plugin(hpu), "fakeplugin_hpu")
    cls = type(RegistryAccelerator("hpu"))
    assert cls.parse_devices(2) == 2 and cls.parse_devices(-1) == 2
    assert cls.get_parallel_devices(2) == [torch.device("hpu")] * 2
    with pytest.raises(DeviceError, match=r"hpu has 2 devices .* ask for 1 to 2"):
        cls.parse_devices(3)
    cpu = type(RegistryAccelerator("cpu"))
    assert cpu.parse_devices(3) == 3 and cpu.get_parallel_devices(2) == [torch.device("cpu")] * 2
    assert cpu.auto_device_count() == 1


def test_an_unavailable_or_unknown_backend_is_refused_with_the_registry_s_reason():
    accelreg.register(plugin(_xpu(available=False)), "fakeplugin_xpu")
    with pytest.raises(DeviceError, match=r"xpu is not available \(scripted\); available: cpu"):
        RegistryAccelerator("xpu")
    assert RegistryAccelerator("cpu").availability().available
    with pytest.raises(DeviceError, match=r"unknown backend 'nonesuch'; registered backends: .*xpu"):
        RegistryAccelerator("nonesuch")
    with pytest.raises(TypeError, match="backend must be a backend name"):
        RegistryAccelerator(3)  # type: ignore[arg-type]
    assert RegistryAccelerator().backend == "cpu"  # the registry's current backend here


def test_one_object_is_an_accelerator_of_both_import_names_and_trains_on_the_cpu():
    pl = pytest.importorskip("pytorch_lightning", reason="the standalone import name (pytorch-lightning)")
    import lightning.fabric.accelerators as lf
    import lightning_fabric.accelerators as lfs

    acc = RegistryAccelerator("cpu")
    for base in (
        L.pytorch.accelerators.Accelerator,
        pl.accelerators.Accelerator,
        lf.Accelerator,
        lfs.Accelerator,
    ):
        assert isinstance(acc, base), base
    assert not ar_lightning.INTEGRATION.enabled and not ar_pl.INTEGRATION.enabled  # no install()
    for package in (L, pl):
        model = tiny(package)
        trainer = package.Trainer(accelerator=acc, devices=1, max_steps=2, **QUIET)
        trainer.fit(model, data())
        assert trainer.accelerator is acc and model.seen["weight"] == torch.device("cpu")
    reference = tiny(L)
    L.Trainer(accelerator="cpu", devices=1, max_steps=2, **QUIET).fit(reference, data())
    assert all(torch.equal(a, b) for a, b in zip(params(model), params(reference), strict=True))


def test_an_accelerator_survives_pickling_for_ddp_spawn():
    acc = RegistryAccelerator("cpu")
    again = pickle.loads(pickle.dumps(acc))
    assert type(again) is type(acc) and again.backend == "cpu"


# -- enable(): names, "auto", strategies, precision, collectives --------------------------------
def test_enable_registers_the_registry_s_names_and_disable_restores_the_registries_exactly():
    before = _registries()
    accelreg.register(plugin(_xpu()), "fakeplugin_xpu")
    ar_lightning.enable()
    names = ar_lightning.registered_names()
    assert "xpu" in names["lightning.pytorch"] and names["lightning.pytorch"] == names["lightning.fabric"]
    assert not {"cpu", "cuda", "mps", "tpu"} & set(names["lightning.pytorch"])  # Lightning's own stay
    assert AcceleratorRegistry["cpu"]["accelerator"] is CPUAccelerator
    assert isinstance(AcceleratorRegistry.get("xpu"), RegistryAccelerator)
    ar_lightning.disable()
    assert _registries() == before and ar_lightning.registered_names() == {}
    after = {k: {n: id(e) for n, e in v.items()} for k, v in _registries().items()}
    assert after == {k: {n: id(e) for n, e in v.items()} for k, v in before.items()}


def test_an_accelerator_package_registering_the_same_name_replaces_accelreg_s_entry():
    accelreg.register(plugin(_xpu()), "fakeplugin_xpu")
    ar_lightning.enable()

    class VendorXPU(CPUAccelerator):
        pass

    AcceleratorRegistry.register("xpu", VendorXPU)  # stock Lightning: "already present" when taken
    try:
        assert AcceleratorRegistry["xpu"]["accelerator"] is VendorXPU
        assert "xpu" not in ar_lightning.registered_names().get("lightning.pytorch", [])
        ar_lightning.disable()
        assert AcceleratorRegistry["xpu"]["accelerator"] is VendorXPU  # not accelreg's to remove
    finally:
        AcceleratorRegistry.pop("xpu", None)


def test_names_auto_strategies_precision_and_collectives_come_from_the_registry():
    accelreg.register(plugin(_xpu()), "fakeplugin_xpu")
    with pytest.raises(ValueError, match="invalid accelerator name"):
        L.Trainer(accelerator="xpu")  # stock: the closed list
    ar_lightning.enable()
    trainer = L.Trainer(accelerator="auto", devices=1, precision="bf16-mixed", **QUIET)
    assert isinstance(trainer.accelerator, RegistryAccelerator) and trainer.accelerator.backend == "xpu"
    assert type(trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert trainer.strategy.root_device == torch.device("xpu", 0)  # stock Lightning: the cpu
    assert trainer.precision_plugin.device == "xpu"  # stock: "cuda"
    trainer = L.Trainer(accelerator="xpu", devices="1,", **QUIET)
    assert trainer.strategy.root_device == torch.device("xpu", 1)
    trainer = L.Trainer(accelerator="xpu", devices=2, strategy="ddp", **QUIET)
    assert trainer.strategy.parallel_devices == [torch.device("xpu", 0), torch.device("xpu", 1)]
    assert trainer.strategy._get_process_group_backend() == "fakeccl"  # accelreg.dist_backend("xpu")
    fabric = L.Fabric(accelerator="auto", devices=1, precision="16-mixed")
    assert fabric.device == torch.device("xpu", 0) and fabric._precision.device == "xpu"
    assert fabric._precision.scaler._device == "xpu"
    fabric = L.Fabric(accelerator="xpu", devices=[1, 2], strategy="ddp")
    assert fabric._strategy.parallel_devices == [torch.device("xpu", 1), torch.device("xpu", 2)]
    assert fabric._strategy._get_process_group_backend() == "fakeccl"
    cpu = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", **QUIET)
    assert cpu.strategy._get_process_group_backend() == "gloo"  # Lightning's own answer for the cpu


def test_auto_is_the_cpu_only_when_the_registry_says_cpu(monkeypatch):
    ar_lightning.enable()
    trainer = L.Trainer(accelerator="auto", devices=1, **QUIET)
    assert type(trainer.accelerator) is CPUAccelerator  # nothing else here: Lightning's own cpu
    assert ar_lightning.registered_names() == {}  # no backend here: Lightning's registries as they were
    ar_lightning.disable()
    monkeypatch.setenv("ACCELREG_DISABLE", "xpu")
    accelreg.reset()
    accelreg.register(plugin(_xpu()), "fakeplugin_xpu")
    ar_lightning.enable()
    assert type(L.Trainer(accelerator="auto", **QUIET).accelerator) is CPUAccelerator
    assert "xpu" not in ar_lightning.registered_names().get("lightning.pytorch", [])  # disabled: not here


def test_auto_keeps_a_pick_of_lightning_s_ladder_unless_the_user_disabled_that_backend(monkeypatch):
    """Lightning's ladder sees a GPU the registry does not (mocked here as in Lightning's own
    tests): its pick stands; with that backend disabled in accelreg, the cpu."""
    from lightning.pytorch.accelerators import CUDAAccelerator

    for where in ("lightning.fabric.accelerators.cuda", "lightning.pytorch.accelerators.cuda"):
        monkeypatch.setattr(f"{where}.num_cuda_devices", lambda: 1)
    ar_lightning.enable()
    assert type(L.Trainer(accelerator="auto", devices=1, **QUIET).accelerator) is CUDAAccelerator
    gpu = "cuda"  # Lightning's name for it and accelreg's (2.2 has no CUDAAccelerator.name())
    monkeypatch.setenv("ACCELREG_DISABLE", gpu)
    accelreg.reset()
    assert type(L.Trainer(accelerator="auto", devices=1, **QUIET).accelerator) is CPUAccelerator


def test_a_launcher_started_process_with_a_present_failing_backend_is_an_error(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    accelreg.register(plugin(_xpu(available=False, runtime_package="json")), "fakeplugin_xpu")
    ar_lightning.enable()
    with pytest.raises(
        DeviceError, match=r"xpu is present \(json is installed\) .* launcher \(LOCAL_RANK=0\)"
    ):
        L.Trainer(accelerator="auto", devices=1, **QUIET)
    with pytest.raises(DeviceError, match="launcher"):
        RegistryAccelerator()
    with pytest.raises(DeviceError, match="launcher"):
        L.Fabric(accelerator="auto", devices=1)
    assert type(L.Trainer(accelerator="cpu", **QUIET).accelerator) is CPUAccelerator  # asked for
