"""The ``accelreg`` command facing hostile input: refused device ids, broken files, warnings
said once. In-process through ``accelreg.cli.main`` (the subprocess path is tests/test_cli.py);
``os.execvpe`` is replaced so that nothing is ever launched from the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import accelreg
from accelreg import cli
from accelreg.testing import clean_environ

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


# -- accelreg run speaks the shell's language (issue 29) ---------------------------------------
def test_run_refuses_malformed_devices_as_a_usage_error_about_devices(launched, capsys):
    """``--devices a,b`` used to blame the backend's visible-devices variable (which the user
    never set) and exit 3; an empty or negative id is refused before the registry is loaded."""
    _two_cuda()
    for devices in ("a,b", "0,,1", "-1", "", "0, 1 2"):
        assert cli.main(["run", "--devices", devices, "--", "torchrun", "x.py"]) == cli.EXIT_USAGE, devices
        err = capsys.readouterr().err
        assert err.startswith(f"accelreg run: --devices {devices!r}: ") and err.count("\n") == 1, err
        assert "CUDA_VISIBLE_DEVICES=" not in err
    assert launched == []


def test_run_refuses_a_backend_without_a_mask_as_a_request_that_failed(launched, capsys):
    assert cli.main(["run", "--backend", "cpu", "--devices", "0", "--", "true"]) == cli.EXIT_FAILED
    assert "cpu has no visible-devices variable" in capsys.readouterr().err and launched == []


def test_run_help_says_the_job_gets_accelreg_run(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "ACCELREG_RUN=1" in " ".join(capsys.readouterr().out.split())


_NOT_EXECUTABLE = "#!/usr/bin/env python3\nprint('ran')\n"


def test_run_exits_126_for_what_cannot_be_executed_and_127_for_what_is_not_found(tmp_path):
    """One line each, as a shell says it, instead of a 20-line traceback and status 1, naming what
    is wrong (a missing #! interpreter by its path). Run in a child (``cli.main`` would become
    the command if it could start it)."""
    (tmp_path / "plain.py").write_text(_NOT_EXECUTABLE)  # no execute bit
    (tmp_path / "noshebang.py").write_text("print('ran')\n")
    (tmp_path / "adir").mkdir()
    bin_dir = tmp_path / "bin"  # put first on the child's PATH
    (bin_dir / "adir-on-path").mkdir(parents=True)
    scripts = {
        "badinterp.py": "#!/nonexistent/python\nprint('ran')\n",
        "bin/badinterp-on-path": "#!/nonexistent/python -u\nprint('ran')\n",
        "crlf.sh": "#!/bin/sh\r\necho ran\r\n",
        "nested.sh": f"#!{tmp_path / 'badinterp.py'}\n",
        "interpdir.sh": f"#!{tmp_path / 'adir'}\n",
        "interpnoexec.sh": f"#!{tmp_path / 'plain.py'}\n",
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
    for name in (*scripts, "noshebang.py"):
        (tmp_path / name).chmod(0o755)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(tmp_path / "fifo")  # exec refuses it; reading its #! line would block
    (tmp_path / "fifo").chmod(0o755)
    cases = {
        "./plain.py": (
            126,
            "cannot execute './plain.py': permission denied (run it as `python ./plain.py`, or `chmod +x` it)",
        ),
        "./noshebang.py": (
            126,
            "cannot execute './noshebang.py': it is not a program and has no #! line (run it as `python ./noshebang.py`",
        ),
        "./badinterp.py": (
            127,
            "cannot execute './badinterp.py': its #! interpreter '/nonexistent/python' was not found",
        ),
        "badinterp-on-path": (
            127,
            "cannot execute 'badinterp-on-path': its #! interpreter '/nonexistent/python' was not found",
        ),
        "./crlf.sh": (
            127,
            "cannot execute './crlf.sh': its #! interpreter '/bin/sh\\r' was not found: the file has Windows line endings",
        ),
        "./nested.sh": (
            127,
            f"cannot execute './nested.sh': its #! interpreter {str(tmp_path / 'badinterp.py')!r} cannot start",
        ),
        "./interpdir.sh": (
            126,
            f"cannot execute './interpdir.sh': its #! interpreter {str(tmp_path / 'adir')!r} is a directory",
        ),
        "./interpnoexec.sh": (
            126,
            f"cannot execute './interpnoexec.sh': its #! interpreter {str(tmp_path / 'plain.py')!r} is not executable",
        ),
        "./adir": (126, "cannot execute './adir': it is a directory"),
        "./fifo": (
            126,
            "cannot execute './fifo': it is not a regular file (a named pipe, a device or a socket)",
        ),
        "./plain.py/x": (126, "cannot execute './plain.py/x': a part of its path is a file, not a directory"),
        "adir-on-path": (
            127,
            f"adir-on-path: command not found (not on PATH; {bin_dir / 'adir-on-path'} is a directory)",
        ),
        "./missing.py": (127, "./missing.py: no such file"),
        "./dangling": (
            127,
            f"./dangling: no such file (a symbolic link to {str(tmp_path / 'gone')!r}, which does not exist)",
        ),
        "accelreg-no-such-command": (127, "accelreg-no-such-command: command not found (not on PATH)"),
        "": (2, "the command name is empty (an unset shell variable after --?)"),
        "a\0b": (2, "argument 0 of the command, 'a\\x00b', contains a NUL character"),
    }
    code = (
        "import contextlib, io, json, os, sys\nfrom accelreg import cli\nout = {}\n"
        f"os.environ['PATH'] = {str(bin_dir)!r} + os.pathsep + os.environ['PATH']\n"
        f"for cmd in {list(cases)!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        status = cli.main(['run', '--', cmd])\n"
        "    out[cmd] = [status, err.getvalue()]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_environ(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for cmd, (status, said) in cases.items():
        assert got[cmd][0] == status, (cmd, got[cmd])
        assert got[cmd][1].startswith(f"accelreg run: {said}") and got[cmd][1].count("\n") == 1, (
            cmd,
            got[cmd],
        )
