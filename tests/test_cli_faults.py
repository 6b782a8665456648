"""The ``accelreg`` command facing hostile input: refused device ids, broken files, warnings
said once. In-process through ``accelreg.cli.main`` (the subprocess path is tests/test_cli.py);
``os.execvpe`` is replaced so that nothing is ever launched from the test process."""

from __future__ import annotations

import warnings

import pytest

import accelreg
from accelreg import cli

from ._fakes import plugin, spec


@pytest.fixture
def launched(monkeypatch):
    """What ``accelreg run`` would have started, instead of starting it."""
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr("accelreg.launch.job.os.execvpe", lambda f, args, env: calls.append((f, args, env)))
    return calls


def _two_cuda(var: str | None = "CUDA_VISIBLE_DEVICES") -> None:
    accelreg.register(plugin(spec("cuda", 2, priority=100, var=var)), "fakeplugin_cli")


def test_run_refuses_ids_the_backend_does_not_have(launched, capsys):
    _two_cuda()
    assert (
        cli.main(["run", "--backend", "cuda", "--devices", "5", "--", "torchrun", "x.py"]) == cli.EXIT_FAILED
    )
    assert "cuda has no device 5: its devices here are 0, 1" in capsys.readouterr().err
    assert launched == []
    assert cli.main(["run", "--devices", "1,0", "--", "torchrun", "x.py"]) == cli.EXIT_OK
    (_, args, env), *_ = launched
    assert args == ["torchrun", "x.py"] and env["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_run_checks_ids_against_an_inherited_mask(launched, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    accelreg.reset()
    _two_cuda()
    assert cli.main(["run", "--devices", "0", "--", "true"]) == cli.EXIT_FAILED
    assert "visible through CUDA_VISIBLE_DEVICES='3,5'" in capsys.readouterr().err
    assert cli.main(["run", "--devices", "5", "--", "true"]) == cli.EXIT_OK and len(launched) == 1


def test_run_refuses_an_unavailable_backend(launched, capsys):
    assert cli.main(["run", "--backend", "npu", "--devices", "0", "--", "true"]) == cli.EXIT_FAILED
    assert "npu is not available here (torch_npu is not installed)" in capsys.readouterr().err
    assert launched == []


def test_a_warning_is_printed_once_and_without_an_internal_source_line(monkeypatch, capsys):
    monkeypatch.setenv("ACCELREG_PRIORITY", "foo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["env"]) == cli.EXIT_OK
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("names 'foo', which no installed plugin provides") == 1, text
    assert "RuntimeWarning" not in text and not [w for w in caught if "accelreg" in str(w.message)]
    accelreg.reset()
    assert cli.main(["resolve", "cpu"]) == cli.EXIT_OK
    err = capsys.readouterr().err
    assert err.count("accelreg: warning: priority (env ACCELREG_PRIORITY) names 'foo'") == 1, err
    assert ".py:" not in err


@pytest.mark.parametrize("strict", [False, True])
def test_config_exits_3_on_a_file_it_cannot_parse(strict, tmp_path, monkeypatch, capsys):
    (tmp_path / "work" / "accelreg.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    if strict:
        monkeypatch.setenv("ACCELREG_STRICT", "1")
    assert cli.main(["config"]) == cli.EXIT_CONFIG
    out = capsys.readouterr()
    assert "RecursionError" in out.out + out.err and "Traceback" not in out.out + out.err


def test_resolve_under_a_launcher_exits_1_past_a_failing_accelerator(monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "0")
    accelreg.register(
        plugin(spec("cuda", 2, priority=100, available=False, runtime_package="json")), "fakeplugin_f"
    )
    assert cli.main(["resolve"]) == cli.EXIT_FAILED
    assert "will not put a distributed job on the cpu silently" in capsys.readouterr().err
