"""Hardware without its runtime (issue 31): a backend's ``HardwareSignature`` sees its hardware
(device nodes, driver files, PCI devices) with nothing imported, and ``accelreg env`` names
hardware that is present while its runtime is missing, with what to install. The machines are
fake: device nodes and sysfs files in a temporary root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import accelreg
from accelreg import cli
from accelreg.cli import env as env_command
from accelreg.registry.hardware import MAX_EVIDENCE, seen
from accelreg.types import HardwareSignature

from ._fakes import plugin, spec
from .test_schemas import check


def machine(
    root: Path, *, nodes: tuple[str, ...] = (), pci: dict[str, tuple[str, str]] | None = None
) -> Path:
    """A fake machine under ``root``: device nodes (empty files), and PCI devices by address
    with their ``vendor`` and ``class`` files as Linux's sysfs has them."""
    for node in nodes:
        path = root / node.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    for address, (vendor, cls) in (pci or {}).items():
        folder = root / "sys/bus/pci/devices" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(cls + "\n")
    return root


ASCEND = HardwareSignature(
    what="Ascend NPU",
    install="torch_npu",
    device_nodes=("/dev/davinci[0-9]*",),
    pci_vendors=("0x19e5",),
    pci_classes=("0x12",),
)


# -- seeing -------------------------------------------------------------------------------
def test_a_signature_sees_device_nodes_and_pci_devices_of_its_class(tmp_path):
    root = machine(
        tmp_path,
        nodes=("/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager"),
        pci={"0000:3b:00.0": ("0x19e5", "0x120000"), "0000:5e:00.0": ("0x19e5", "0x020000")},  # an NPU, a NIC
    )
    assert seen(ASCEND, str(root)) == (
        "/dev/davinci0",
        "/dev/davinci1",
        "PCI 0000:3b:00.0 (vendor 0x19e5, class 0x120000)",
    )


def test_without_its_hardware_a_signature_sees_nothing(tmp_path):
    assert seen(ASCEND, str(tmp_path)) == ()  # no /dev, no /sys
    root = machine(tmp_path, nodes=("/dev/davinci_manager",), pci={"0000:5e:00.0": ("0x19e5", "0x020000")})
    assert seen(ASCEND, str(root)) == ()  # the manager node and a Huawei NIC are not an NPU


def test_files_and_a_vendor_without_a_class_filter(tmp_path):
    sig = HardwareSignature(what="x", files=("/proc/driver/acme/version",), pci_vendors=("0x1da3",))
    root = machine(
        tmp_path, nodes=("/proc/driver/acme/version",), pci={"0000:01:00.0": ("0x1DA3", "0x120000")}
    )
    assert seen(sig, str(root)) == (
        "/proc/driver/acme/version",
        "PCI 0000:01:00.0 (vendor 0x1da3, class 0x120000)",
    )


def test_evidence_is_capped(tmp_path):
    root = machine(tmp_path, nodes=tuple(f"/dev/davinci{i}" for i in range(8)))
    found = seen(ASCEND, str(root))
    assert len(found) == MAX_EVIDENCE + 1 and found[-1] == f"... and {8 - MAX_EVIDENCE} more"


def test_an_unreadable_pci_entry_is_no_evidence(tmp_path):
    root = machine(tmp_path, pci={"0000:3b:00.0": ("0x19e5", "0x120000")})
    (root / "sys/bus/pci/devices/0000:3b:00.0/class").unlink()
    (root / "sys/bus/pci/devices/0000:3b:00.0/class").mkdir()  # a read fails: not an NPU
    assert seen(ASCEND, str(root)) == ()


# -- what a plugin may declare --------------------------------------------------------------
@pytest.mark.parametrize(
    ("hardware", "problem"),
    [
        ("/dev/acme0", "not a HardwareSignature"),
        (HardwareSignature(what=""), "hardware.what"),
        (HardwareSignature(what="Acme"), "names nothing to look for"),
        (HardwareSignature(what="Acme", device_nodes=("dev/acme0",)), "hardware.device_nodes"),
        (HardwareSignature(what="Acme", files=("/sys/../etc/shadow",)), "hardware.files"),
        (HardwareSignature(what="Acme", pci_vendors=("19e5",)), "hardware.pci_vendors"),
        (
            HardwareSignature(what="Acme", pci_vendors=("0x19e5",), pci_classes=("0x1",)),
            "hardware.pci_classes",
        ),
        (
            HardwareSignature(what="Acme", device_nodes=("/dev/a",), pci_classes=("0x12",)),
            "narrows pci_vendors",
        ),
        (HardwareSignature(what="Acme", device_nodes="/dev/acme0"), "hardware.device_nodes"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_signature_fails_its_plugin_alone(hardware, problem):
    accelreg.register(plugin(spec("cuda", 1, available=False, hardware=hardware)), "fakeplugin_hw")
    assert "cuda" not in {b.name for b in accelreg.backends() if b.provider == "<registered>"}
    (failure,) = [f for f in accelreg.failures() if f.plugin == "fakeplugin_hw"]
    assert failure.stage == "accelreg_backends" and problem in failure.error, failure


def test_a_signature_is_copied_with_pci_ids_lower_cased():
    sig = HardwareSignature(what=" Acme  X1 ", device_nodes=["/dev/acme[0-9]*"], pci_vendors=("0xABCD",))  # type: ignore[arg-type]
    accelreg.register(plugin(spec("cuda", 1, available=False, hardware=sig)), "fakeplugin_hw")
    snap = accelreg.registry.get()
    assert snap.by_name["cuda"].spec.hardware == HardwareSignature(
        what="Acme X1", device_nodes=("/dev/acme[0-9]*",), pci_vendors=("0xabcd",)
    )


def test_the_builtins_declare_signatures_that_validate():
    snap = accelreg.registry.get()
    declared = {b.name for b in snap.order if b.spec.hardware is not None}
    assert {"cuda", "npu", "hpu", "mlu", "musa"} <= declared
    assert not [f for f in accelreg.failures() if f.distribution == "accelreg"]
    for name in declared:
        assert snap.by_name[name].spec.hardware.install, name


# -- accelreg env ---------------------------------------------------------------------------
@pytest.fixture
def node(tmp_path):
    """A machine with two Ascend NPUs and an NVIDIA GPU (and its audio function), whose
    runtimes (torch_npu, a CUDA build of torch) are not installed."""
    return machine(
        tmp_path,
        nodes=("/dev/davinci0", "/dev/davinci1"),
        pci={
            "0000:3b:00.0": ("0x19e5", "0x120000"),
            "0000:af:00.0": ("0x10de", "0x030200"),
            "0000:af:00.1": ("0x10de", "0x040300"),
        },
    )


def test_env_names_hardware_whose_runtime_is_missing_with_what_to_install(node):
    report = env_command.env_report(hardware_root=str(node))
    check("env", report)
    found = {item["backend"]: item for item in report["hardware"]}
    assert set(found) == {"npu", "cuda"}
    assert found["npu"] == {
        "backend": "npu",
        "what": "Huawei Ascend NPU",
        "evidence": ["/dev/davinci0", "/dev/davinci1", "PCI 0000:3b:00.0 (vendor 0x19e5, class 0x120000)"],
        "reason": "torch_npu is not installed",
        "install": "torch_npu (pip install torch-npu) with Ascend's CANN toolkit",
    }
    assert found["cuda"]["evidence"] == ["PCI 0000:af:00.0 (vendor 0x10de, class 0x030200)"]  # not the audio
    assert "built without CUDA" in found["cuda"]["reason"] and "CUDA (NVIDIA)" in found["cuda"]["install"]


def test_env_on_this_machine_reports_no_hardware_it_does_not_have(tmp_path):
    assert env_command.env_report(hardware_root=str(tmp_path))["hardware"] == []


def test_env_text_and_report_show_the_section(node, monkeypatch, capsys):
    report = env_command.env_report(hardware_root=str(node))
    monkeypatch.setattr(env_command, "env_report", lambda **_options: report)
    assert cli.main(["env"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "hardware without its runtime (install what each line says to use it):" in out
    assert (
        "  npu: Huawei Ascend NPU found (/dev/davinci0, /dev/davinci1, PCI 0000:3b:00.0 (vendor 0x19e5, "
        "class 0x120000)), but npu is unavailable: torch_npu is not installed"
        in " ".join(out.split("\n    "))
    )
    assert "      install torch_npu (pip install torch-npu) with Ascend's CANN toolkit" in out
    assert cli.main(["env", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["hardware"] == report["hardware"]
    markdown = env_command.markdown_report(report)
    assert "**Hardware without its runtime**" in markdown
    assert "- npu: Huawei Ascend NPU found (/dev/davinci0" in markdown
    assert max(len(line) for line in markdown.splitlines()) <= env_command.REPORT_WIDTH


def test_a_disabled_or_available_backend_is_not_reported(node, monkeypatch):
    monkeypatch.setenv("ACCELREG_DISABLE", "npu")
    accelreg.reset()
    assert [i["backend"] for i in env_command.env_report(hardware_root=str(node))["hardware"]] == ["cuda"]
    monkeypatch.delenv("ACCELREG_DISABLE")
    working = spec("cuda", 1, available=True, hardware=HardwareSignature(what="GPU", pci_vendors=("0x10de",)))
    accelreg.register(plugin(working), "fakeplugin_hw")  # replaces the built-in cuda: available
    assert [i["backend"] for i in env_command.env_report(hardware_root=str(node))["hardware"]] == ["npu"]
