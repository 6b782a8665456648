"""``accelreg env`` as the thing users paste into bug reports (issue 21, part 3), and the
configuration problems it and ``accelreg config`` show (part 2): one test per field.

The fields: OS, Python, CPU, RAM, numpy and the libraries; each backend's runtime and driver
versions (the ``versions`` probe of ``BackendSpec``); the configuration files read;
``--report`` (Markdown, at most 100 columns); ``--json`` (complete: tests/test_schemas.py
checks it against the schema). Per device its name, total and free memory:
tests/emu/test_env_devices.py, on the emulated accelerator.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import accelreg
from accelreg import registry
from accelreg.cli import main
from accelreg.cli.env import REPORT_WIDTH, env_report, markdown_report
from accelreg.testing import run_python
from accelreg.types import BackendSpec

from ._fakes import plugin, spec

ROOT = Path(__file__).resolve().parent.parent
#: The checkout's emulator plugin first (the shared environment may have another checkout's).
EMU_PATH = os.pathsep.join(
    [str(ROOT), str(ROOT / "plugins" / "accelreg-emu"), os.environ.get("PYTHONPATH", "")]
)


def _env(capsys, *args: str) -> str:
    assert main(["env", *args]) == 0
    return capsys.readouterr().out


def _cli(
    args: list[str],
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: dict[str, str] | None = None,
) -> str:
    """``accelreg ARGS`` in this process (``accelreg.cli.main``), run from ``cwd`` with ``extra``
    set, on a registry built for it: what it printed. tests/test_cli.py runs each command once
    as a subprocess; the configuration files a fresh process reads from its folder are read here
    the same way (the registry is rebuilt after the move)."""
    monkeypatch.chdir(cwd)
    for key, value in (extra or {}).items():
        monkeypatch.setenv(key, value)
    accelreg.reset()
    capsys.readouterr()
    main(args)
    return capsys.readouterr().out


# -- the host -----------------------------------------------------------------------------
def test_os_and_python(capsys):
    host = env_report()["host"]
    assert host["os"] == platform.platform()
    assert host["python"] == platform.python_version()
    assert host["python_implementation"] == platform.python_implementation()
    assert host["python_executable"] == sys.executable
    text = _env(capsys)
    assert f"OS: {platform.platform()}" in text
    assert f"Python: {platform.python_version()} ({platform.python_implementation()}" in text


def test_cpu_model_and_cores(capsys):
    host = env_report()["host"]
    assert host["cpu_count"] == os.cpu_count()
    assert host["cpu"] and host["cpu"].endswith(f"{os.cpu_count()} logical cores")
    if Path("/proc/cpuinfo").exists():
        models = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.split(":", 1)[0].strip() == "model name"
        ]
        if models:
            assert host["cpu"].startswith(models[0])
    assert f"CPU: {host['cpu']}" in _env(capsys)


def test_ram_total_and_available(capsys):
    host = env_report()["host"]
    assert host["memory_total"] > 0 and 0 <= host["memory_available"] <= host["memory_total"]
    if Path("/proc/meminfo").exists():
        total_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        assert host["memory_total"] == total_kb * 1024
    assert "RAM: " in _env(capsys) and " total, " in _env(capsys)


def test_numpy_and_the_libraries(capsys):
    report = env_report()
    assert report["versions"]["numpy"] == metadata.version("numpy")
    assert report["libraries"]["transformers"] == metadata.version("transformers")
    assert report["libraries"]["accelerate"] == metadata.version("accelerate")
    text = _env(capsys)
    assert f"numpy: {metadata.version('numpy')}" in text
    assert f"transformers {metadata.version('transformers')}" in text


HIDE = """
import importlib.abc, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Hide())
from accelreg.cli import main
sys.exit(main({argv!r}))
"""


def test_without_numpy_env_says_so_instead_of_torchs_warning():
    """A core-only install: torch warns "Failed to initialize NumPy" when it is imported; the
    report says numpy is not installed, and prints no such warning."""
    result = run_python(HIDE.format(hidden={"numpy", "transformers"}, argv=["env"]), name=None)
    assert "Failed to initialize NumPy" not in result.stderr, result.stderr
    assert "numpy: not installed" in result.stdout
    data = run_python(HIDE.format(hidden={"numpy"}, argv=["env", "--json"]), name=None).stdout
    assert json.loads(data)["versions"]["numpy"] is None


# -- devices and runtimes -----------------------------------------------------------------
def test_an_unavailable_backend_reports_its_versions_but_no_devices(capsys):
    accelreg.register(
        plugin(spec("xpu", 2, priority=100, available=False, versions=lambda: {"driver": "1.2.3"})),
        "fakeplugin_versions",
    )
    xpu = next(b for b in env_report()["backends"] if b["name"] == "xpu")
    assert xpu["versions"] == {"driver": "1.2.3"} and xpu["device_info"] == []
    assert "xpu: driver 1.2.3" in _env(capsys)


def test_cuda_reports_its_build_and_its_driver(monkeypatch):
    """No CUDA here: torch's build fields and the driver's version file are stand-ins."""
    import torch

    from accelreg.builtin import cuda

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    files = {
        "/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar"
    }
    monkeypatch.setattr(cuda, "read_first_line", files.get)
    assert cuda._versions() == {"CUDA (torch build)": "12.4", "NVIDIA driver": "550.54.15"}
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(cuda, "read_first_line", {"/sys/module/amdgpu/version": "6.8.5"}.get)
    assert cuda._versions() == {"HIP (torch build)": "6.2.41133", "amdgpu driver": "6.8.5"}


def test_a_vendor_package_version_comes_from_its_metadata_without_an_import():
    from accelreg.builtin._torchmod import _versions

    assert _versions("pluggy", None) == {"pluggy": metadata.version("pluggy")}
    assert _versions("torch_acme_not_installed", lambda: {"driver": "9"}) == {"driver": "9"}


def test_versions_and_device_name_are_probes_contained_like_the_others():
    from accelreg.registry.probing import check_name, check_versions

    assert check_versions({"a": "1", "b": ""}) == {"a": "1"}
    assert check_name("  Acme\nX1  ") == "Acme X1"
    for bad in ([("a", "1")], {"a": 1}, {f"k{i}": "1" for i in range(17)}, {"x" * 65: "1"}):
        with pytest.raises(Exception, match="versions returned"):
            check_versions(bad)

    def boom() -> dict[str, str]:
        raise RuntimeError("driver library missing")

    accelreg.register(
        plugin(spec("xpu", 2, priority=100, versions=boom, device_name=lambda i: 42)),
        "fakeplugin_bad_versions",
    )
    xpu = registry.get().backend("xpu")
    assert xpu.versions() == {} and xpu.device_name(0) is None
    stages = {f.stage for f in registry.get().failures}
    assert {"probe versions of 'xpu'", "probe device_name of 'xpu'"} <= stages


def test_a_spec_whose_versions_is_not_callable_fails_alone():
    bad = BackendSpec(
        name="xpu", priority=1, is_available=lambda: True, device_count=lambda: 1, versions="1.0"
    )
    accelreg.register(plugin(bad), "fakeplugin_versions_str")
    assert "xpu" not in {b.name for b in accelreg.backends() if b.provider != "accelreg"}
    assert any("versions of 'xpu' is not callable" in f.error for f in registry.get().failures)


# -- configuration ------------------------------------------------------------------------
def test_the_configuration_files_read_are_named_first(tmp_path, monkeypatch, capsys):
    (tmp_path / "accelreg.toml").write_text('disable = ["mlu"]\n')
    out = _cli(["env"], tmp_path, monkeypatch, capsys).splitlines()
    assert out[1] == f"config: read {tmp_path / 'accelreg.toml'}"
    data = json.loads(_cli(["env", "--json"], tmp_path, monkeypatch, capsys))
    assert data["config"] == {"files": [str(tmp_path / "accelreg.toml")], "errors": [], "warnings": []}


def test_a_malformed_file_is_at_the_top_and_in_the_priority_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "accelreg.toml").write_text('priority = ["npu"\n')
    stdout = _cli(["env"], tmp_path, monkeypatch, capsys)
    lines = stdout.splitlines()
    assert lines[1] == "config: no configuration file read"
    assert lines[2].startswith(f"config: SKIPPED {tmp_path / 'accelreg.toml'}: malformed TOML")
    priority = next(line for line in lines if line.startswith("priority: "))
    assert priority.endswith("(from default; 1 configuration file skipped, see config above)")
    assert lines.count(lines[2]) == 1  # not repeated under warnings
    assert "malformed TOML" not in stdout.split("priority: ")[1]


def test_a_typo_key_gets_did_you_mean(tmp_path, monkeypatch, capsys):
    (tmp_path / "accelreg.toml").write_text('priorty = ["npu"]\n')
    out = _cli(["env"], tmp_path, monkeypatch, capsys)
    assert "unknown setting 'priorty' (did you mean 'priority'?)" in out.split("\n\n")[0]
    with pytest.raises(
        accelreg.ConfigError, match=r"unknown setting 'priorty' \(did you mean 'priority'\?\)"
    ):
        accelreg.configure(priorty=["npu"])


def test_accelreg_config_shows_values_shadowed_by_a_higher_channel(tmp_path, monkeypatch, capsys):
    (tmp_path / "accelreg.toml").write_text('priority = ["npu"]\nstrict = false\n')
    user = tmp_path / "user.toml"
    user.write_text('priority = ["mlu"]\n')
    extra = {"ACCELREG_PRIORITY": "xpu,npu", "ACCELREG_CONFIG": str(user)}
    data = json.loads(_cli(["config", "--json"], tmp_path, monkeypatch, capsys, extra))["values"]
    assert (
        data["priority"]["value"] == ["xpu", "npu"] and data["priority"]["source"] == "env ACCELREG_PRIORITY"
    )
    assert data["priority"]["shadowed"] == [
        {"value": ["npu"], "source": str(tmp_path / "accelreg.toml")},
        {"value": ["mlu"], "source": str(user)},
    ]
    assert data["strict"]["shadowed"] == []
    text = _cli(["config"], tmp_path, monkeypatch, capsys, extra)
    assert f"priority = npu  from {tmp_path / 'accelreg.toml'}  (overridden by env ACCELREG_PRIORITY)" in text
    assert f"priority = mlu  from {user}  (overridden by env ACCELREG_PRIORITY)" in text


def test_an_argument_shadows_the_environment():
    os.environ["ACCELREG_STRICT"] = "0"
    try:
        settings = accelreg.config.load_settings({"strict": True})
    finally:
        del os.environ["ACCELREG_STRICT"]
    assert settings.strict is True and settings.shadowed["strict"] == (("env ACCELREG_STRICT", False),)


# -- --report -----------------------------------------------------------------------------
def test_report_is_markdown_within_100_columns_and_carries_every_field(capsys, tmp_path, monkeypatch):
    long_name = tmp_path / ("deep" * 30)
    long_name.mkdir()
    (long_name / "accelreg.toml").write_text('priorty = ["npu"]\n')
    monkeypatch.chdir(long_name)
    accelreg.reset()
    text = _env(capsys, "--report")
    assert text.startswith("### Environment (`accelreg env --report`)\n")
    assert max(len(line) for line in text.splitlines()) <= REPORT_WIDTH
    report = env_report()
    host = report["host"]
    for needle in (
        f"accelreg {report['versions']['accelreg']}, torch {report['versions']['torch']}",
        f"- OS: {host['os']}",
        f"- Python: {host['python']}",
        "- CPU: ",
        "- RAM: ",
        f"- numpy: {report['versions']['numpy']}",
        "- libraries: transformers",
        "- config: read",
        "did you mean 'priority'",
        "- priority: ",
        "- resolve(): cpu",
        "| # | backend | available | devices | provider |",
        "- cuda: ",
        "**Integrations**",
    ):
        assert needle in text, needle
    # two reports a moment apart: the same text, except the free memory the host has now
    ram = re.compile(r"^- RAM: .*$", re.M)
    assert ram.sub("- RAM: ...", text) == ram.sub("- RAM: ...", markdown_report() + "\n")


def test_report_tables_fit_by_cutting_the_widest_cell():
    from accelreg.cli.env import _md_table

    lines = _md_table([["npu:0", "x" * 300, "1 GB", "1 GB"]], ["device", "name", "total", "free"])
    assert max(len(line) for line in lines) <= REPORT_WIDTH and lines[2].count("...") == 1


def test_report_and_json_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["env", "--json", "--report"])
    assert "not allowed with" in capsys.readouterr().err


def test_env_report_is_the_docs_example():
    """docs/getting-started.md shows how to paste it; the command is what it says."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert "accelreg env --report" in page
    assert textwrap.dedent("accelreg env --report") in (ROOT / "README.md").read_text()
