"""The accelreg command, run as users run it: a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BUILTINS = ["cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu", "mps", "cpu"]


def run(*args, env=None, cwd=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "accelreg", *args], capture_output=True, text=True, env=full, cwd=cwd
    )


def test_env_tells_the_truth_on_this_cpu_machine():
    out = run("env", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = {b["name"]: b for b in report["backends"]}
    assert set(BUILTINS) <= set(rows)
    for name in BUILTINS[:-1]:
        assert rows[name]["available"] is False and rows[name]["reason"]
        assert rows[name]["provider"] == "accelreg"
    assert rows["npu"]["reason"] == "torch_npu is not installed"
    assert "built without CUDA" in rows["cuda"]["reason"]
    assert report["resolve"]["device"] == "cpu"
    text = run("env")
    assert text.returncode == 0
    for name in BUILTINS:
        assert f" {name} " in text.stdout
    assert "resolve(): cpu" in text.stdout


def test_env_shows_visible_mapping():
    out = run("env", "--json", env={"ASCEND_RT_VISIBLE_DEVICES": "3,1"})
    npu = {b["name"]: b for b in json.loads(out.stdout)["backends"]}["npu"]
    assert npu["visible_devices"] == ["3", "1"]
    assert "[0->3, 1->1]" in run("env", env={"ASCEND_RT_VISIBLE_DEVICES": "3,1"}).stdout


def test_config_shows_sources(tmp_path):
    (tmp_path / "accelreg.toml").write_text("priority = ['npu']\n")
    out = run("config", "--json", env={"ACCELREG_DISABLE": "mlu"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout)["values"]
    assert values["priority"] == {"value": ["npu"], "source": str(tmp_path / "accelreg.toml"), "shadowed": []}
    assert values["disable"] == {"value": ["mlu"], "source": "env ACCELREG_DISABLE", "shadowed": []}
    assert values["strict"]["source"] == "default"


def test_config_exit_code_on_broken_file(tmp_path):
    (tmp_path / "accelreg.toml").write_text("priority = [\n")
    out = run("config", cwd=tmp_path)
    assert out.returncode == 3 and "malformed TOML" in out.stderr and "malformed TOML" not in out.stdout


def test_bad_env_variable_exit_code():
    out = run("env", env={"ACCELREG_PRIORITY": "npu,,cuda"})
    assert out.returncode == 3 and "configuration error" in out.stderr


@pytest.mark.parametrize(
    ("spec", "code", "text"),
    [
        ("cpu", 0, "cpu"),
        ("auto", 0, "cpu"),
        ("0", 1, "no accelerator"),
        ("npu:1", 1, "torch_npu is not installed"),
        ("CPU", 1, "lower case"),
    ],
)
def test_resolve_command(spec, code, text):
    out = run("resolve", spec)
    assert out.returncode == code
    assert text in (out.stdout + out.stderr)


def test_resolve_json():
    ok = json.loads(run("resolve", "cpu", "--json").stdout)
    assert ok == {"spec": "cpu", "device": "cpu"}
    bad = run("resolve", "npu:1", "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["type"] == "DeviceError"


def test_help_and_usage_error():
    assert run("--help").returncode == 0
    assert run().returncode == 2
    assert run("nonsense").returncode == 2
