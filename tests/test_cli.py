"""The accelreg command: one subprocess per command, run as users run it (``env``, ``config``,
``resolve``; ``plan``'s is tests/test_planner_cli.py's), and the rest in-process through
``accelreg.cli.main`` (faster, and the same code: issue 31)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import accelreg
from accelreg import cli

BUILTINS = ["cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu", "mps", "cpu"]


def run(*args, env=None, cwd=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "accelreg", *args], capture_output=True, text=True, env=full, cwd=cwd
    )


def in_process(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_env_tells_the_truth_on_this_cpu_machine(capsys):
    out = run("env", "--json")  # the subprocess smoke test of `env`
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
    code, text, _ = in_process(capsys, "env")
    assert code == 0
    for name in BUILTINS:
        assert f" {name} " in text
    assert "resolve(): cpu" in text


def test_env_shows_visible_mapping(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3,1")
    accelreg.reset()
    code, out, _ = in_process(capsys, "env", "--json")
    npu = {b["name"]: b for b in json.loads(out)["backends"]}["npu"]
    assert code == 0 and npu["visible_devices"] == ["3", "1"]
    assert "[0->3, 1->1]" in in_process(capsys, "env")[1]


def test_config_shows_sources(tmp_path):
    (tmp_path / "accelreg.toml").write_text("priority = ['npu']\n")
    out = run("config", "--json", env={"ACCELREG_DISABLE": "mlu"}, cwd=tmp_path)  # `config`'s smoke test
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout)["values"]
    assert values["priority"] == {"value": ["npu"], "source": str(tmp_path / "accelreg.toml"), "shadowed": []}
    assert values["disable"] == {"value": ["mlu"], "source": "env ACCELREG_DISABLE", "shadowed": []}
    assert values["strict"]["source"] == "default"


def test_bad_env_variable_exit_code(capsys, monkeypatch):
    monkeypatch.setenv("ACCELREG_PRIORITY", "npu,,cuda")
    accelreg.reset()
    code, _, err = in_process(capsys, "env")
    assert code == cli.EXIT_CONFIG and err.startswith("accelreg: configuration error: ")


@pytest.mark.parametrize(
    ("spec", "code", "text"),
    [
        ("cpu", 0, "cpu"),
        ("auto", 0, "cpu"),
        ("0", 1, "no accelerator"),
        ("npu:1", 1, "torch_npu is not installed"),
        ("CPU", 2, "lower case"),  # not a device spec: bad input
        ("npu:x", 2, "npu:x"),
    ],
)
def test_resolve_command(capsys, spec, code, text):
    got, out, err = in_process(capsys, "resolve", spec)
    assert got == code
    assert text in (out + err)


def test_resolve_json(capsys):
    ok = run("resolve", "cpu", "--json")  # the subprocess smoke test of `resolve`
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"spec": "cpu", "device": "cpu"}
    code, out, _ = in_process(capsys, "resolve", "npu:1", "--json")
    assert code == 1
    assert json.loads(out)["type"] == "DeviceError"


def test_help_and_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0
    assert cli.main([]) == 2
    with pytest.raises(SystemExit) as stop:
        cli.main(["nonsense"])
    assert stop.value.code == 2
    capsys.readouterr()
