"""``accelreg plan``: as users run it (one subprocess), and in-process for the options."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelreg.cli import main

from .test_planner_support import model_type, quiet, violations

README = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]


@pytest.fixture(autouse=True)
def _quiet():
    quiet()


def run_json(capsys, *args):
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_readme_line_splits_gpt2_over_two_npus_and_the_cpu_in_a_subprocess():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    out = subprocess.run(
        [sys.executable, "-m", "accelreg", *README, "--json"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    used = {p["place"]: p["used"] for p in data["places"]}
    assert all(used[p] > 0 for p in ("npu:0", "npu:1", "cpu"))
    budgets = {"npu:0": "250MB", "npu:1": "250MB", "cpu": "1GB"}
    assert violations(model_type("gpt2"), data["device_map"], budgets) == ()
    assert data["build_seconds"] > 0 and data["plan_seconds"] > 0


def test_text_output_shows_the_table_the_ranges_and_the_map(capsys):
    assert main(README) == 0
    text = capsys.readouterr().out
    assert "place" in text and "headroom" in text
    assert "transformer.h.2-9" in text  # layer ranges, not one line per block
    assert "device_map:" in text and "lm_head" in text
    assert "planned in" in text and "built on meta in" in text


def test_tiny_budgets_leave_gpt2_on_the_cpu_and_say_why(capsys):
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=60MB,npu:1=60MB,cpu=1GB")
    assert code == 0
    assert data["device_map"] == {"": "cpu"}
    assert any("headroom" in n for n in data["notes"])


def test_options_reach_the_planner(capsys):
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=1GB,npu:1=1GB", "--strategy", "sequential"
    )
    assert code == 0 and data["device_map"] == {"": "npu:0"}
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=300MB,npu:1=300MB", "--dtype", "bf16"
    )
    assert code == 0 and data["dtype"] == "bfloat16" and data["total"] == 124_439_808 * 2
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=1GB", "--quantization", "8bit")
    assert code == 0 and data["quantization"] == "bnb_8bit" and data["dtype"] == "float16"
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=100MB,npu:1=600MB", "--no-split", "GPT2Model"
    )
    assert code == 0 and data["device_map"] == {"": "npu:1"}


def test_without_max_memory_it_plans_for_this_machine(capsys):
    code, data = run_json(capsys, "plan", "gpt2")
    assert code == 0
    assert data["budget_source"] == "registry" and data["device_map"] == {"": "cpu"}


def test_a_local_config_directory(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=4).save_pretrained(tmp_path)
    code, data = run_json(capsys, "plan", str(tmp_path), "--max-memory", "npu:0=10MB,npu:1=10MB,cpu=1GB")
    assert code == 0 and "GPT2LMHeadModel" in data["built"]


def test_plots(tmp_path, capsys):
    for name in ("plan.png", "plan.svg"):
        assert main([*README, "--plot", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 1000
    capsys.readouterr()
    assert main([*README, "--plot", str(tmp_path / "plan.pdf")]) == 2
    assert "png or .svg" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["plan", "gpt3"], 2, "did you mean"),
        (["plan", "gpt2", "--max-memory", "npu:0"], 2, "DEVICE=SIZE"),
        (["plan", "gpt2", "--max-memory", "npu:0=1Gb"], 2, "ambiguous"),
        (["plan", "gpt2", "--max-memory", "npu:0=1GB,npu:0=2GB"], 2, "twice"),
        (["plan", "gpt2", "--max-memory", "0=1GB"], 1, "no accelerator"),
        (["plan", "gpt2", "--max-memory", "npu:0=10MB"], 1, "short by"),
        (["plan", "gpt2", "--max-memory", "npu:0=1GB", "--dtype", "fp13"], 2, "unknown dtype"),
    ],
)
def test_errors_have_stable_exit_codes(capsys, args, code, needle):
    assert main(args) == code
    assert needle in capsys.readouterr().err


def test_no_fit_in_json(capsys):
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=10MB")
    assert code == 1 and "short by" in data["error"] and data["violations"]
