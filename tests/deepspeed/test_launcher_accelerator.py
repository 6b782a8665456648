"""What DeepSpeed's launcher asks of the accelerator accelreg hands it, on a vendor backend
DeepSpeed has no class for (the emulator as ``emu``, three devices), in one child process.

The launcher itself runs end to end in ``test_launcher.py``; here each answer is checked alone:
the device count under the mask as it is now, the backend's variable and slots taken as
positions in an inherited mask, the variables exported to other nodes, ``DS_ACCELERATOR``
naming a registry backend, and the refusal under a launcher when the backend fails.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.accelreg_emu(name="emu", devices=3, OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1"),
]

MASK = "ACCELREG_EMU_VISIBLE_DEVICES"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    import accelreg
    from accelreg.integrations import deepspeed as integration

    for var in ("DS_ACCELERATOR", "LOCAL_RANK", "RANK", "WORLD_SIZE", "ACCELREG_RUN", MASK):
        monkeypatch.delenv(var, raising=False)
    accelreg.reset()
    yield integration
    integration.unprepare()
    integration.disable()
    accelreg.reset()


def test_device_count_follows_the_mask_as_it_is_now(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's runner removes the mask after turning it into ``--include`` and then counts
    the node's slots: the count under the new mask comes from a fresh interpreter (the emulated
    runtime, like a real one, keeps the count it started with)."""
    import torch

    acc = fresh.registry_accelerator("emu")
    assert acc.device_count() == 3 == torch.emu.device_count()
    monkeypatch.setenv(MASK, "0,2")
    assert acc.device_count() == 2 and torch.emu.device_count() == 3
    monkeypatch.setenv(MASK, "")
    assert acc.device_count() == 0
    monkeypatch.delenv(MASK)
    assert acc.device_count() == 3


def test_slots_are_physical_ids_or_positions_in_an_inherited_mask(fresh) -> None:
    import accelreg

    acc = fresh.registry_accelerator("emu")
    assert acc.visible_devices_envs() == [MASK]
    env: dict[str, str] = {}
    acc.set_visible_devices_envs(env, [2, 0])
    assert env == {MASK: "2,0"}  # no mask: DeepSpeed's slot ids are physical ids
    env = {MASK: "1,2"}  # e.g. accelreg run --devices 1,2, kept by a hostfile launch
    acc.set_visible_devices_envs(env, [1])
    assert env == {MASK: "2"}  # slot 1 is the mask's second device, never physical 1
    with pytest.raises(
        accelreg.DeviceError, match=r"slot\(s\) 2 of emu, but ACCELREG_EMU_VISIBLE_DEVICES='1,2'"
    ):
        acc.set_visible_devices_envs({MASK: "1,2"}, [2])
    with pytest.raises(accelreg.DeviceError, match="cannot be read"):
        acc.set_visible_devices_envs({MASK: "x"}, [0])


def test_other_nodes_get_accelregs_variables_not_this_nodes_mask(fresh) -> None:
    """DeepSpeed's runner exports every variable whose name starts with one of the accelerator's
    ``export_envs()`` to the nodes it starts over pdsh/ssh/MPI; DeepSpeed's own accelerators get
    accelreg's variables added too."""
    from deepspeed.accelerator import get_accelerator

    import accelreg
    from accelreg.integrations.deepspeed.accelerator import EXPORTED

    exports = fresh.registry_accelerator("emu").export_envs()
    for name in ("ACCELREG_RUN", "ACCELREG_AUTO_INSTALL", "ACCELREG_PRIORITY", "ACCELREG_CPU_FALLBACK"):
        assert name in exports
    assert not any(MASK.startswith(prefix) for prefix in exports), exports  # a node's devices are its own
    accelreg.configure(disable=["emu"])  # the registry chooses the cpu: DeepSpeed's own class
    fresh.enable()
    own = get_accelerator()
    assert type(own).__name__ == "CPU_Accelerator"
    assert set(EXPORTED) <= set(own.export_envs())


def test_ds_accelerator_naming_a_registry_backend(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.accelerator import get_accelerator, real_accelerator

    before = real_accelerator.ds_accelerator  # DeepSpeed's own pick at import (no install() here)
    monkeypatch.setenv("DS_ACCELERATOR", "emu")  # DeepSpeed alone refuses it: not in its list
    assert "DS_ACCELERATOR=emu names a registry backend" in fresh.accelerator_report()["how"]
    fresh.enable()
    acc = get_accelerator()
    assert type(acc).__name__ == "RegistryAccelerator" and acc.device_name(1) == "emu:1"
    report = fresh.accelerator_report()
    assert report["how"].startswith("handed over by accelreg (DS_ACCELERATOR=emu") and report["agree"], report
    fresh.disable()
    assert real_accelerator.ds_accelerator is before
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # one of DeepSpeed's own: the user's DeepSpeed choice
    fresh.enable()
    assert real_accelerator.ds_accelerator is before


def test_a_failing_backend_under_a_launcher_gives_deepspeed_no_accelerator(
    fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never DeepSpeed's cpu accelerator: its first use of an accelerator raises the DeviceError."""
    from deepspeed.accelerator import get_accelerator, real_accelerator

    import accelreg

    before = real_accelerator.ds_accelerator
    monkeypatch.setenv("ACCELREG_EMU_MEMORY", "not-a-size")  # the emulated driver fails
    monkeypatch.setenv("LOCAL_RANK", "0")
    accelreg.reset()
    with pytest.raises(accelreg.DeviceError, match="emu is present"):
        fresh.enable()
    with pytest.raises(
        accelreg.DeviceError, match=r"DeepSpeed needs its accelerator \(device_name\).*emu is present"
    ):
        get_accelerator().device_name()
    report = fresh.accelerator_report()
    assert report["deepspeed"] == "none" and report["how"].startswith("refused by accelreg"), report
    assert not report["agree"]
    fresh.unprepare()  # uninstall() gives DeepSpeed back what it had
    assert real_accelerator.ds_accelerator is before
    monkeypatch.delenv("LOCAL_RANK")  # outside a launcher: a warning, and the registry's cpu
    accelreg.reset()
    with pytest.warns(RuntimeWarning, match="emu is present"):
        fresh.enable()
    assert get_accelerator()._name == "cpu" and os.environ["ACCELREG_EMU_MEMORY"] == "not-a-size"
