"""The ``accelreg`` command behaves like a Unix tool: ``--version``, pipes closed early,
the terminal's width, and one-line errors that say what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import accelreg
from accelreg.cli import EXIT_PIPE, main
from accelreg.cli._format import table as _table

README_PLAN = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"accelreg {accelreg.__version__} (torch ") and "Python" in out


def test_env_header_names_the_versions(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["env"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"accelreg {accelreg.__version__} (torch ")
    assert main(["env", "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    assert versions["accelreg"] == accelreg.__version__ and versions["torch"] and versions["python"]


def _closed_pipe() -> tuple[int, int]:
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE, as after `| head` has exited
    return read, write


def test_a_closed_pipe_ends_env_quietly():
    _, write = _closed_pipe()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "accelreg", "env", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert proc.returncode == EXIT_PIPE, proc.stderr
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored"


def test_a_closed_pipe_ends_plan_quietly(monkeypatch):
    _, write = _closed_pipe()
    saved = os.dup(1)
    try:
        with os.fdopen(os.dup(write), "w") as broken:
            monkeypatch.setattr(sys, "stdout", broken)
            assert main(README_PLAN) == EXIT_PIPE
    finally:
        os.dup2(saved, 1)  # main pointed fd 1 at /dev/null
        os.close(saved)
        os.close(write)


def test_table_fits_the_width():
    rows = [["0", "npu", "ASCEND_RT_VISIBLE_DEVICES unset", "torch_npu is not installed on this machine"]]
    header = ["#", "backend", "visible devices", "why"]
    wide = _table(rows, header)
    assert len(wide.splitlines()) == 3  # no width: one line per row
    wrapped = _table(rows, header, 70).splitlines()
    assert max(map(len, wrapped)) <= 70 and len(wrapped) == 4
    assert wrapped[3].startswith(" " * 45)  # under the why column
    assert wrapped[2].split("  ")[-1] + " " + wrapped[3].strip() == rows[0][-1]
    stacked = _table(rows, header, 40).splitlines()
    assert max(map(len, stacked)) <= 40
    assert "    why: torch_npu is not installed on" in stacked


def test_env_fits_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    assert any(line.strip() == "why: torch_npu is not installed" for line in lines)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(" npu " in line and line.endswith("torch_npu is not installed") for line in lines)


def test_plan_without_transformers_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now fails
    assert main(["plan", "gpt2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "accelreg plan: building 'gpt2' needs transformers, which is not installed "
        "(pip install 'accelreg[hf]')"
    )


def test_plot_to_a_missing_folder_is_refused_before_the_model_is_built(capsys, tmp_path, monkeypatch):
    import accelreg.cli.plan as plan_command

    monkeypatch.setattr(plan_command, "build_meta_model", lambda *a, **k: pytest.fail("built"))
    target = str(tmp_path / "missing" / "x.png")
    assert main([*README_PLAN, "--plot", target]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"accelreg plan: --plot {target!r}: the folder to write it in does not exist"
    ]


def test_a_plot_that_cannot_be_written_prints_the_plan_then_one_line(capsys, tmp_path):
    target = tmp_path / "x.png"
    target.mkdir()  # a folder where the file should go: found only when the plot is written
    assert main([*README_PLAN, "--plot", str(target)]) == 1
    out, err = capsys.readouterr()
    assert "device_map:" in out and "lm_head" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"accelreg plan: --plot {str(target)!r}: cannot write the file"
    )
    assert main([*README_PLAN, "--plot", str(target), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["device_map"] and data["plot"] is None and "cannot write" in data["plot_error"]


def test_headroom_column_is_explained(capsys):
    assert main(README_PLAN) == 0
    out = capsys.readouterr().out
    assert "headroom: space reserved (not free)" in out
