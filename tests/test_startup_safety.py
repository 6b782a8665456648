"""The start-up hook never hangs a job, never breaks Python, never hands a job the cpu (issue 29).

``accelreg-startup.pth`` runs in every Python process of the environment, so each of its
guarantees (docs/reliability.md, "The start-up hook") is a test here:

* a job process with a healthy vendor plugin and each optional-import idiom finishes in normal
  time (the hook once ran ``install()`` under Python's import lock and waited the 60 s probe
  timeout), also where the registry is built inside an import;
* with accelreg, pluggy or a dependency removed or broken, a plain process prints nothing and
  works, and a job process stops with one line and exit status 3 before its code runs on;
* the switches' values, ``python -I`` and ``-S``, and the double ``.pth`` pass of 3.11 venvs.

Everything that breaks an installation runs in a throwaway virtual environment
(tests/_venvs.py: links to this environment's site-packages, a few milliseconds to build),
never in the developer's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelreg import flags
from accelreg.launch import startup
from accelreg.testing import clean_environ

from ._venvs import SITE_PACKAGES, throwaway_venv

ROOT = Path(__file__).resolve().parent.parent
PTH = "accelreg-startup.pth"

#: A healthy vendor plugin, installed as a distribution with an entry point (a backend that
#: answers at once, of a device type torch knows without a runtime).
VENDOR_PLUGIN = """
from accelreg import plugin


@plugin.hookimpl
def accelreg_backends():
    yield plugin.BackendSpec(
        name="acme",
        priority=500,
        device_type="hpu",
        is_available=lambda: plugin.Availability.yes("driver loaded"),
        device_count=lambda: 2,
        visible_devices_var="ACME_VISIBLE_DEVICES",
    )
"""
VENDOR = {
    "acme_accel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme-accel\nVersion: 1.0\n",
    "acme_accel-1.0.dist-info/entry_points.txt": "[accelreg]\nacme = acme_accel.plugin\n",
    "acme_accel/__init__.py": "",
    "acme_accel/plugin.py": VENDOR_PLUGIN,
}
#: A stand-in for DeepSpeed (a host library the hook watches), cheap to import: the module
#: whose import makes accelreg hand DeepSpeed its accelerator, which builds the registry inside
#: that import.
FAKE_DEEPSPEED = {
    "deepspeed/__init__.py": "from .accelerator import real_accelerator\n",
    "deepspeed/accelerator/__init__.py": "",
    "deepspeed/accelerator/real_accelerator.py": "ds_accelerator = None\n",
}
#: What a job would do after its imports: ask the registry. Prints what it found and the time.
REPORT = """
import json, time
from accelreg import registry
snap = registry.get()
print(json.dumps({"failures": [str(f) for f in snap.failures], "acme": snap.backend("acme").available,
                  "seconds": round(time.perf_counter() - T0, 2)}))
"""
#: Far below the 60 s probe timeout a job used to wait, far above a loaded machine's start-up.
NORMAL_SECONDS = 20.0


def _environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_environ().items() if not k.startswith(("ACCELREG_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the linked packages are the developer's own
    env.update(extra)
    return env


def _python(
    python: Path | str, code: str, *, options: tuple[str, ...] = (), timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *options, "-c", code],
        capture_output=True,
        text=True,
        env=_environ(**env),
        timeout=timeout,
        cwd=os.path.dirname(str(python)),
    )


def _no_deepspeed(root: Path, **add: str) -> Path:
    """An environment like this one with the vendor plugin installed and without DeepSpeed
    (nor the emulator: one vendor plugin is the case at hand)."""
    return throwaway_venv(root, leave_out=("deepspeed*", "*accelreg_emu*"), add={**VENDOR, **add})


# -- never hangs a job -----------------------------------------------------------------------
IDIOMS = {
    "try/except ImportError": "try:\n    import deepspeed\nexcept ImportError:\n    deepspeed = None\nassert deepspeed is None\n",
    "importlib.util.find_spec": (
        "import importlib.util\n"
        "assert importlib.util.find_spec('deepspeed') is None\n"
        "assert importlib.util.find_spec('peft') is not None  # installed, looked at, not imported\n"
    ),
    "module __getattr__ importing lazily": "import lazylib\nassert lazylib.deepspeed is None and lazylib.sub.HAVE is False\n",
    "an import inside a thread": (
        "import threading\n"
        "def optional():\n"
        "    try:\n        import deepspeed\n    except ImportError:\n        pass\n"
        "t = threading.Thread(target=optional)\nt.start()\nt.join()\n"
    ),
}
#: A library whose module ``__getattr__`` imports an optional dependency on first use, asked
#: for it while the library itself is still being imported (its submodule asks).
LAZYLIB = {
    "lazylib/__init__.py": (
        "def __getattr__(name):\n"
        "    if name == 'deepspeed':\n"
        "        try:\n            import deepspeed\n        except ImportError:\n            return None\n"
        "        return deepspeed\n"
        "    raise AttributeError(name)\n"
        "from . import sub\n"
    ),
    "lazylib/sub.py": "import lazylib\nHAVE = lazylib.deepspeed is not None\n",
}


def _finishes_in_normal_time(python: Path, code: str) -> dict[str, object]:
    t0 = time.perf_counter()
    proc = _python(python, "import time\nT0 = time.perf_counter()\n" + code + REPORT, ACCELREG_RUN="1")
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failures"] == [] and report["acme"] is True, report
    assert wall < NORMAL_SECONDS, f"took {wall:.1f} s: {report}"
    return report


@pytest.mark.parametrize("idiom", list(IDIOMS))
def test_an_optional_import_of_a_missing_library_costs_no_time(tmp_path: Path, idiom: str) -> None:
    """The issue's case: under ``accelreg run``, with a healthy vendor plugin, a script that
    looks for DeepSpeed on a machine without it. The hook ran ``install()`` (which built the
    registry, whose plugin imports run on a probe thread) under Python's import lock, so the job
    waited the whole probe timeout (60 s) and lost the vendor's backend. A library that is not
    installed runs nothing now; the probe timeout is left at its default here."""
    _finishes_in_normal_time(_no_deepspeed(tmp_path, **LAZYLIB), IDIOMS[idiom])


VENDOR_IMPORTING_DEEPSPEED = {
    **VENDOR,
    "acme_accel-1.0.dist-info/entry_points.txt": "[accelreg]\nacme = acme_accel\n",
    "acme_accel/__init__.py": VENDOR_PLUGIN + "\nimport deepspeed  # the vendor's DeepSpeed support\n",
}


@pytest.mark.parametrize(
    "how",
    [
        "import acme_accel\n",
        "import threading\nt = threading.Thread(target=__import__, args=('acme_accel',))\nt.start()\nt.join()\n",
    ],
    ids=["main thread", "a thread"],
)
def test_a_host_library_imported_inside_another_import_builds_the_registry_there(
    tmp_path: Path, how: str
) -> None:
    """An installed host library imported while another import is under way — here by the
    vendor's own package, whose plugin entry point is that package: the registry is built inside
    that import (DeepSpeed is handed its accelerator then). Its plugin code runs in the
    importing thread; on a probe thread it would wait for that import's lock until the probe
    timed out (60 s), and the vendor's backend would be lost."""
    python = throwaway_venv(
        tmp_path,
        leave_out=("deepspeed*", "*accelreg_emu*"),
        add={**VENDOR_IMPORTING_DEEPSPEED, **FAKE_DEEPSPEED},
    )
    _finishes_in_normal_time(python, how)


_STATE = (
    "import sys, json\n"
    "finders = [f for f in sys.meta_path if type(f).__module__ == 'accelreg.importwatch']\n"
    "print(json.dumps(['accelreg.launch.startup' in sys.modules, len(finders)]))\n"
)


# -- never breaks Python, never hands a job the cpu ----------------------------------------
#: A job's script: the imports it starts with, then work that must never happen without accelreg.
JOB = "import deepspeed\nprint('TRAINED', flush=True)\n"
BROKEN = {
    "the accelreg package removed": {"keep": (PTH,)},
    "pluggy missing": {"leave_out": ("pluggy*",)},
    "pluggy broken": {
        "leave_out": ("pluggy*",),
        "add": {"pluggy/__init__.py": "raise RuntimeError('pluggy is half-installed')\n"},
    },
    "accelreg broken": {"leave_out": ("__editable__*accelreg-*", "__editable___accelreg_0*")},
}
#: What each stop names.
NAMED = {
    "the accelreg package removed": "No module named 'accelreg'",
    "pluggy missing": "No module named 'pluggy'",
    "pluggy broken": "RuntimeError: pluggy is half-installed",
    "accelreg broken": "SyntaxError",
}


def _broken(root: Path, case: str) -> Path:
    how = dict(BROKEN[case])
    add = {**FAKE_DEEPSPEED, **how.pop("add", {})}
    if case == "accelreg broken":  # a copy of the package with one module mangled
        add["accelreg"] = ROOT / "accelreg"
    python = throwaway_venv(root, leave_out=("deepspeed*", *how.pop("leave_out", ())), add=add, **how)
    if case == "accelreg broken":
        site = python.parent.parent / "lib" / SITE_PACKAGES.parent.name / "site-packages"
        (site / "accelreg" / "flags.py").write_text("def broken(:\n")
    return python


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_install_stops_a_job_process_with_one_line(tmp_path: Path, case: str) -> None:
    """The job stops before DeepSpeed's code (or anything after it) runs, with one line naming
    what is broken and status 3 — from the ``.pth`` line when accelreg cannot be imported, from
    ``install()`` when pluggy cannot. It used to warn and train on the cpu, or print Python's
    "Error processing line 1" traceback twice and go on."""
    python = _broken(tmp_path, case)
    proc = _python(python, JOB, ACCELREG_RUN="1")
    assert proc.returncode == startup.EXIT_BROKEN, (proc.returncode, proc.stdout, proc.stderr)
    assert "TRAINED" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith("accelreg: this job process cannot run without accelreg")
        and NAMED[case] in lines[0]
    )


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_install_leaves_a_plain_process_alone(tmp_path: Path, case: str) -> None:
    """Outside a job nothing of accelreg runs: no output, and the script works (including
    ``-I``, which keeps the ``.pth`` files, and imports of the host library)."""
    python = _broken(tmp_path, case)
    for options in ((), ("-I",)):
        proc = _python(python, JOB, options=options)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "TRAINED\n", ""), (options, proc.stderr)


def test_auto_install_and_isolated_mode_stop_too(tmp_path: Path) -> None:
    """``ACCELREG_AUTO_INSTALL=1`` asks for accelreg as ``accelreg run`` does, and ``python -I``
    still processes site-packages' ``.pth`` files."""
    python = _broken(tmp_path, "pluggy missing")
    for options, env in (((), {"ACCELREG_AUTO_INSTALL": "yes"}), (("-I",), {"ACCELREG_RUN": "1"})):
        proc = _python(python, JOB, options=options, **env)
        assert proc.returncode == startup.EXIT_BROKEN and "TRAINED" not in proc.stdout, (
            options,
            env,
            proc.stderr,
        )
        assert "No module named 'pluggy'" in proc.stderr


def test_an_off_switch_arms_nothing_even_when_pluggy_is_missing(tmp_path: Path) -> None:
    python = _broken(tmp_path, "pluggy missing")
    for value in ("0", "false", "No", " off ", ""):
        proc = _python(python, JOB + _STATE, ACCELREG_RUN=value)
        assert proc.returncode == 0 and proc.stderr == "", (value, proc.stderr)
        assert proc.stdout.splitlines()[0] == "TRAINED" and json.loads(proc.stdout.splitlines()[-1])[1] == 0


def test_the_stop_is_the_same_line_from_the_pth_and_from_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ``.pth`` line cannot import accelreg to say it: it spells the same sentence and status."""
    monkeypatch.setattr(startup.os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
    with pytest.raises(SystemExit) as stopped:
        startup.stop("@@")
    said = capsys.readouterr().err
    head, tail = said.rstrip("\n").split("@@")
    line = (ROOT / PTH).read_text()
    assert stopped.value.code == startup.EXIT_BROKEN and f"os._exit({startup.EXIT_BROKEN})" in line
    assert head in line and tail in line and said.count("\n") == 1


# -- the switches ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("OFF", False),
        ("", False),
        ("  ", False),
        ("maybe", None),
        ("2", None),
        ("y", None),
    ],
)
def test_one_parser_of_on_and_off_words(text: str, value: bool | None) -> None:
    from accelreg.config import parse_bool
    from accelreg.errors import ConfigError

    assert flags.parse(text) is value
    if value is None:
        with pytest.raises(ConfigError, match="expected a boolean"):
            parse_bool(text, "ACCELREG_STRICT")
    else:
        assert parse_bool(text, "ACCELREG_STRICT") is value


def test_an_unknown_switch_value_counts_as_off_and_says_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"ACCELREG_RUN": "enabled"}
    assert startup.armed(env) is False and startup.armed(env) is False
    err = capsys.readouterr().err
    assert err == (
        "accelreg: ACCELREG_RUN='enabled' is neither on (1, true, yes, on) nor off (0, false, no, off, "
        "empty); it counts as off\n"
    )


@pytest.mark.parametrize("value", ["1", " TRUE ", "On", "0", "off", "", "maybe"])
@pytest.mark.parametrize("var", ["ACCELREG_RUN", "ACCELREG_AUTO_INSTALL"])
def test_the_vllm_integration_reads_the_switches_as_the_start_up_hook_does(
    var: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM integration arms the processes vLLM spawns (``ACCELREG_AUTO_INSTALL=1``) exactly
    when this process's switches would not have armed the hook: it reads them with the one
    parser (it had its own list of on words, and took ``ACCELREG_RUN=0`` for on)."""
    from accelreg.integrations.vllm import integration

    for name in ("ACCELREG_RUN", "ACCELREG_AUTO_INSTALL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(var, value)
    assert integration._armed() is startup.armed() is (flags.parse(value) is True)


@pytest.mark.parametrize("value", ["0", "false", "no", "off"])
def test_an_off_accelreg_run_is_no_launcher(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ACCELREG_RUN=0`` used to count as set: the hook armed and the registry refused a cpu
    fallback as if a launcher had started the process."""
    from accelreg import registry

    monkeypatch.setenv("ACCELREG_RUN", value)
    registry.reset()
    assert registry.get().launcher is None and not startup.armed()
    monkeypatch.setenv("ACCELREG_RUN", "1")
    registry.reset()
    assert registry.get().launcher == ("ACCELREG_RUN", "1") and startup.armed()


def test_a_job_process_with_an_unknown_value_runs_unarmed_with_one_line() -> None:
    for options in ((), ("-W", "error")):
        proc = _python(sys.executable, _STATE, options=options, ACCELREG_RUN="maybe")
        assert proc.returncode == 0 and json.loads(proc.stdout) == [True, 0], proc.stderr
        assert (
            proc.stderr.count("\n") == 1
            and "ACCELREG_RUN='maybe'" in proc.stderr
            and "counts as off" in proc.stderr
        )


# -- -I, -S and the double .pth pass ---------------------------------------------------------
def test_isolated_mode_still_arms_and_no_site_skips_the_hook() -> None:
    """``python -I`` ignores ``PYTHON*`` variables and the user site, not site-packages' ``.pth``
    files: a job process is armed. ``-S`` imports no ``site``: the hook does not run (the
    process still counts as launcher-started for ``resolve()``)."""
    armed = {
        opts: json.loads(_python(sys.executable, _STATE, options=opts, ACCELREG_RUN="1").stdout)
        for opts in ((), ("-I",), ("-S",))
    }
    assert armed == {(): [True, 1], ("-I",): [True, 1], ("-S",): [False, 0]}


def test_the_pth_line_run_twice_arms_once(tmp_path: Path) -> None:
    """Python 3.11 venvs process site-packages' ``.pth`` files twice (counted here by a second
    ``.pth`` file); the line is run once more by hand: one watcher, and ``install()`` once, on
    the first host import."""
    count = "import builtins; builtins.PTH_PASSES = getattr(builtins, 'PTH_PASSES', 0) + 1\n"
    python = throwaway_venv(
        tmp_path, leave_out=("deepspeed*", "*accelreg_emu*"), add={**FAKE_DEEPSPEED, "zz-count.pth": count}
    )
    code = (
        f"exec({(ROOT / PTH).read_text()!r})\n"
        "from accelreg.launch import startup\n"
        "calls = []\n"
        "startup.install = lambda: calls.append(1)\n"
        + _STATE
        + "import deepspeed\nprint(PTH_PASSES, len(calls))\n"
    )
    proc = _python(python, code, ACCELREG_RUN="1")
    assert proc.returncode == 0, proc.stderr
    state, counts = proc.stdout.splitlines()[-2:]
    passes, installs = map(int, counts.split())
    assert (
        json.loads(state) == [True, 1]
        and installs == 1
        and passes == (2 if sys.version_info[:2] == (3, 11) else passes)
    )


def test_the_installed_pth_is_the_repository_s() -> None:
    installed = SITE_PACKAGES / PTH
    assert installed.read_text() == (ROOT / PTH).read_text(), (
        f"{installed} is stale: reinstall accelreg (pip install -e .)"
    )
