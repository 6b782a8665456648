"""Configuration parsing, the off state, the ``emu`` name, the accelreg entry point and the
build cache's locking (in-process where no torch backend is touched)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import threading
import time
from pathlib import Path

import accelreg_emu
import pytest
from accelreg_emu import _build
from accelreg_emu._config import (
    DEFAULT_CAPACITY,
    EmuConfigError,
    default_capacity,
    host_memory,
    parse_size,
    read_config,
)

from accelreg.testing import run_python

pytestmark = pytest.mark.emu

MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2GiB", 2 << 30), ("512MiB", 512 * MIB), ("1.5GB", 1_500_000_000), ("4096", 4096), ("64 kib", 65536)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "2 parsecs", "-1", "1e9"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(EmuConfigError, match="ACCELREG_EMU_MEMORY"):
        parse_size(text)


def test_config_defaults_and_off() -> None:
    cfg = read_config({})
    assert not cfg.enabled and cfg.name is None
    assert cfg.device_count == 2 and cfg.capacities == (default_capacity(2),) * 2


def test_the_default_capacity_fits_the_host() -> None:
    """Two devices on a 24 GiB host get 8 GiB each (a share is left to the host), never more
    than 64 GiB; the host's RAM is read here without importing anything."""
    assert default_capacity(2, host=24 << 30) == 8 << 30
    assert default_capacity(2, host=1 << 40) == DEFAULT_CAPACITY == 64 << 30
    assert default_capacity(64, host=24 << 30) == (24 << 30) // 65 // MIB * MIB
    assert default_capacity(2, host=None) <= DEFAULT_CAPACITY
    host = host_memory()
    assert host is not None and host > 0  # Linux, as CI runs it
    cfg = read_config({"ACCELREG_EMU_NAME": "npu"})
    assert sum(cfg.physical_capacities) < host and not cfg.oversubscribed()
    many = read_config({"ACCELREG_EMU_NAME": "npu", "ACCELREG_EMU_DEVICES": "8"})
    assert sum(many.physical_capacities) < host and not many.oversubscribed()
    asked = read_config({"ACCELREG_EMU_NAME": "npu", "ACCELREG_EMU_MEMORY": "64GiB"})
    assert asked.oversubscribed(host=24 << 30) and not asked.oversubscribed(host=1 << 40)


def test_an_oversubscribed_device_says_so_in_its_name(monkeypatch) -> None:
    from accelreg_emu import plugin

    monkeypatch.setenv("ACCELREG_EMU_NAME", "npu")
    monkeypatch.setattr(plugin, "host_memory", lambda: 24 << 30)
    assert plugin._device_name(0) == "accelreg-emu NPU 0 (emulated on the host)"
    monkeypatch.setenv("ACCELREG_EMU_MEMORY", "64GiB")
    assert plugin._device_name(1) == (
        "accelreg-emu NPU 1 (emulated on the host; oversubscribed: 128.0 GiB emulated on 24.0 GiB of RAM)"
    )


def test_config_memory_list_and_mask() -> None:
    env = {
        "ACCELREG_EMU_NAME": "npu",
        "ACCELREG_EMU_DEVICES": "3",
        "ACCELREG_EMU_MEMORY": "1MiB,2MiB,3MiB",
        "ASCEND_RT_VISIBLE_DEVICES": "2,0",
    }
    cfg = read_config(env)
    assert cfg.visible_devices_var == "ASCEND_RT_VISIBLE_DEVICES"
    assert cfg.visible == (2, 0) and cfg.device_count == 2 and cfg.capacities == (3 * MIB, 1 * MIB)
    # A mask is read from the variable of the name in use only.
    assert read_config({**env, "ACCELREG_EMU_NAME": "mlu"}).device_count == 3
    assert read_config({**env, "ASCEND_RT_VISIBLE_DEVICES": ""}).device_count == 0


def test_config_shallow_copy_override_is_on_unless_turned_off() -> None:
    assert read_config({"ACCELREG_EMU_NAME": "npu"}).shallow_copy
    assert not read_config({"ACCELREG_EMU_NAME": "npu", "ACCELREG_EMU_SHALLOW_COPY": "0"}).shallow_copy
    assert read_config({"ACCELREG_EMU_NAME": "npu"}).as_dict()["shallow_copy"] is True


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"ACCELREG_EMU_NAME": "cuda"}, "ACCELREG_EMU_NAME='cuda'"),
        ({"ACCELREG_EMU_NAME": "emu", "ACCELREG_EMU_DEVICES": "two"}, "ACCELREG_EMU_DEVICES"),
        ({"ACCELREG_EMU_NAME": "emu", "ACCELREG_EMU_MEMORY": "1GiB,2GiB,3GiB"}, "3 sizes for 2 devices"),
        ({"ACCELREG_EMU_NAME": "emu", "ACCELREG_EMU_VISIBLE_DEVICES": "5"}, "device 5 does not exist"),
        ({"ACCELREG_EMU_NAME": "emu", "ACCELREG_EMU_VISIBLE_DEVICES": "1,1"}, "listed twice"),
        ({"ACCELREG_EMU_NAME": "hpu", "HABANA_VISIBLE_MODULES": "x"}, "HABANA_VISIBLE_MODULES"),
        ({"ACCELREG_EMU_NAME": "npu", "ACCELREG_EMU_SHALLOW_COPY": "no"}, "ACCELREG_EMU_SHALLOW_COPY"),
    ],
)
def test_config_errors_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(EmuConfigError, match=None) as info:
        read_config(env)
    assert fragment in str(info.value)


def test_entry_point_is_registered() -> None:
    (ep,) = [e for e in importlib.metadata.entry_points(group="accelreg") if e.name == "emu"]
    assert ep.value == "accelreg_emu.plugin"
    assert ep.dist is not None and ep.dist.name == "accelreg-emu"


def test_concurrent_first_uses_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two first uses at once: one builds under the lock, the other waits and loads."""
    import torch

    monkeypatch.setenv("ACCELREG_EMU_CACHE", str(tmp_path))
    monkeypatch.setattr(_build, "_loaded", {})
    builds: list[int] = []
    loads: list[str] = []

    def fake_build(variant: str, target: Path) -> None:
        builds.append(threading.get_ident())
        time.sleep(0.3)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"not really a library")

    monkeypatch.setattr(_build, "_build", fake_build)
    monkeypatch.setattr(torch.ops, "load_library", loads.append)
    results: list[Path] = []
    both_started = threading.Barrier(2)

    def first_use() -> None:
        both_started.wait()
        results.append(_build.load_library("hpu"))

    threads = [threading.Thread(target=first_use) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(builds) == 1, builds
    assert len(results) == 2 and results[0] == results[1] == _build.library_path("hpu")
    assert str(tmp_path) in str(results[0]) and results[0].parent.name.startswith(torch.__version__)
    # The builder already has the library loaded (cpp_extension loads what it builds); the
    # waiter, which found no library before it queued on the lock, loads the finished file.
    assert loads == [str(results[0])], loads


@pytest.mark.accelreg_emu(name=None)
class TestOff:
    """Emulation off (``ACCELREG_EMU_NAME`` unset), in a fresh process."""

    def test_no_shim_is_importable(self) -> None:
        for name in ("torch_npu", "torch_mlu", "torch_musa", "torch_sdaa", "habana_frameworks"):
            assert importlib.util.find_spec(name) is None, name
        assert "accelreg_emu_pth" not in sys.modules

    def test_plugin_reports_off_without_importing_torch(self) -> None:
        from accelreg_emu.plugin import accelreg_backends

        (spec,) = list(accelreg_backends())
        assert spec.name == "emu" and spec.priority == 5
        avail = spec.is_available()
        assert not avail.available and "emulation is off: set ACCELREG_EMU_NAME=" in avail.reason, avail
        assert spec.device_count() == 0
        assert "torch" not in sys.modules, "a probe imported torch with emulation off"

    def test_activate_refuses(self) -> None:
        import accelreg_emu

        assert not accelreg_emu.is_enabled() and not accelreg_emu.config()["enabled"]
        try:
            accelreg_emu.activate()
        except RuntimeError as e:
            assert "emulation is off" in str(e)
        else:
            raise AssertionError("activate() worked with ACCELREG_EMU_NAME unset")


@pytest.mark.accelreg_emu(name="emu", devices=3, memory="1MiB,2MiB,3MiB", ACCELREG_EMU_VISIBLE_DEVICES="1,2")
class TestEmuName:
    """The emulator under its own name ``emu``, with a mask (3 devices, 1,2 visible)."""

    @pytest.fixture(autouse=True, scope="class")
    def activated(self) -> None:
        accelreg_emu.activate()

    def test_no_vendor_shim_under_emu(self) -> None:
        for name in ("torch_npu", "torch_mlu", "torch_musa", "torch_sdaa", "habana_frameworks"):
            assert importlib.util.find_spec(name) is None, name

    def test_emu_device_type_and_module(self) -> None:
        import torch

        assert accelreg_emu.activate() is accelreg_emu.activate(), "activate() is idempotent"
        assert torch.emu.device_count() == 2 and torch.accelerator.current_accelerator() == torch.device(
            "emu"
        )
        x = torch.ones(3, device="emu:1") * 2
        assert x.device == torch.device("emu", 1) and x.cpu().tolist() == [2.0, 2.0, 2.0]
        try:
            x + torch.ones(3, device="emu:0")
        except RuntimeError as e:
            assert "emu:1 and emu:0!" in str(e), str(e)
        else:
            raise AssertionError("mixed devices accepted")

    def test_module_to_keeps_its_parameters(self) -> None:
        import torch

        from ._identity import module_to_keeps_parameters  # imports torch: not in TestOff's child

        module_to_keeps_parameters(torch.device("emu", 1))

    def test_emu_visible_mask(self) -> None:
        import torch

        # ACCELREG_EMU_DEVICES=3, ACCELREG_EMU_MEMORY=1MiB,2MiB,3MiB, ACCELREG_EMU_VISIBLE_DEVICES=1,2
        cfg = accelreg_emu.config()
        assert cfg["visible"] == [1, 2] and cfg["capacities"] == [2 * MIB, 3 * MIB], cfg
        assert torch.emu.mem_get_info(1) == (3 * MIB, 3 * MIB)

    def test_plugin_spec_under_emu(self) -> None:
        import torch
        from accelreg_emu.plugin import accelreg_backends

        from accelreg.types import Availability

        (spec,) = list(accelreg_backends())
        assert (spec.name, spec.priority, spec.visible_devices_var) == (
            "emu",
            5,
            "ACCELREG_EMU_VISIBLE_DEVICES",
        )
        avail = spec.is_available()
        assert isinstance(avail, Availability) and avail.available, avail
        assert spec.device_count() == 2 and spec.current_index() == 0
        keep = torch.empty(MIB, dtype=torch.uint8, device="emu:0")
        info = spec.memory_info(0)
        assert info.total == 2 * MIB and info.free == 2 * MIB - torch.emu.memory_allocated(0), info
        del keep


def test_bad_setting_fails_import_with_the_variable_named() -> None:
    proc = run_python("import torch_npu", name="npu", memory="plenty", check=False)
    assert proc.returncode != 0 and "ACCELREG_EMU_MEMORY: 'plenty' is not a size" in proc.stderr, proc.stderr
