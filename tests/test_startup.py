"""Every Python process of a job asks the registry: the start-up hook and ``accelreg run``.

``accelreg-startup.pth`` (installed with accelreg) arms :mod:`accelreg.launch.startup` in a
process whose environment has ``ACCELREG_RUN`` (set by ``accelreg run``) or
``ACCELREG_AUTO_INSTALL``; ``install()`` then runs when the process first imports a host
library. These run real child interpreters (the ``.pth`` only acts at interpreter start-up).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from accelreg.launch import startup
from accelreg.testing import clean_environ, run_python

_MODULES = "import sys, json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('accelreg'))))"
_ENABLED = (
    "import json, accelreg.integrations as i\n"
    "print(json.dumps({x['name']: x['enabled'] for x in i.status()}))\n"
)


def test_the_pth_file_is_installed_beside_accelreg() -> None:
    """The set-up installs the hook where the interpreter reads it (site-packages' root)."""
    pth = Path(sysconfig.get_paths()["purelib"]) / "accelreg-startup.pth"
    assert pth.is_file(), f"{pth} is missing: reinstall accelreg (pip install -e .)"
    line = pth.read_text().strip()
    assert "ACCELREG_RUN" in line and "ACCELREG_AUTO_INSTALL" in line and line.count("\n") == 0


def test_a_process_outside_a_job_loads_nothing_of_accelreg() -> None:
    assert run_python(_MODULES, name=None).value == []


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"ACCELREG_RUN": "1"}, id="run"),
        # the same hook, armed by the other switch (test_startup_safety.py checks the switches)
        pytest.param({"ACCELREG_AUTO_INSTALL": "1"}, id="auto_install", marks=pytest.mark.slow),
    ],
)
def test_a_job_process_waits_cheaply_then_installs_on_the_first_host_import(env: dict[str, str]) -> None:
    code = _MODULES + "\nimport peft\n" + _ENABLED
    lines = run_python(code, name=None, env=env).stdout.splitlines()
    at_start = json.loads(lines[0])
    # before a host library is imported: the hook alone, no registry, no integration module
    assert set(at_start) <= {
        "accelreg",
        "accelreg.errors",
        "accelreg.deferred",
        "accelreg.entrypoints",
        "accelreg.flags",
        "accelreg.importwatch",
        "accelreg.integrations",
        "accelreg.integrations._machinery",
        "accelreg.integrations._machinery.table",
        "accelreg.integrations._moved",
        "accelreg.launch",
        "accelreg.launch.startup",
    }
    assert "accelreg.registry" not in at_start
    enabled = json.loads(lines[-1])
    assert enabled["peft"] is True and enabled["transformers"] is True  # peft imports transformers


def test_the_armed_hook_imports_nothing_python_had_not_loaded_but_its_own_modules() -> None:
    """Every Python process of a job pays for the hook (docs/benchmarks.md: start-up under
    ``accelreg run``): besides accelreg's few modules it imports nothing of note — not typing,
    logging, threading or importlib.abc (they cost about 70 ms on the loaded CI machine)."""
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    bare = set(run_python(code, name=None).value)
    armed = set(run_python(code, name=None, env={"ACCELREG_RUN": "1"}).value)
    added = {m for m in armed - bare if not m.startswith("accelreg")}
    heavy = {"typing", "logging", "threading", "warnings", "importlib.abc", "importlib.util", "tempfile"}
    assert not added & heavy and len(added) <= 3, sorted(added)  # importlib itself, at most


@pytest.mark.parametrize("value", ["0", "no", "", "off"])
def test_auto_install_off_values_arm_nothing(value: str) -> None:
    """An off word is read by the one parser (:mod:`accelreg.flags`), so the hook's module is
    imported to read it (an empty value is not even that): nothing is armed, and no registry."""
    assert not startup.armed({"ACCELREG_AUTO_INSTALL": value})
    code = _MODULES + "\nprint(sum(type(f).__module__ == 'accelreg.importwatch' for f in sys.meta_path))"
    out = run_python(code, name=None, env={"ACCELREG_AUTO_INSTALL": value}).stdout.splitlines()
    assert out[1] == "0" and "accelreg.registry" not in json.loads(out[0])
    assert json.loads(out[0]) == [] if value == "" else "accelreg.launch.startup" in json.loads(out[0])


def test_the_watch_list_covers_every_host_library() -> None:
    from accelreg.integrations import table

    names = startup.watched()
    for name, trigger in table.BUILTIN.items():
        if name in table.FOLLOWERS:  # torch: every job process imports it; install() waits for a host library
            assert trigger not in names and trigger.split(".")[0] not in names
        else:
            assert trigger in names and trigger.split(".")[0] in names


@pytest.mark.parametrize("name", ["npu", "emu"])
def test_deepspeed_gets_the_registry_accelerator_before_it_picks_one(name: str) -> None:
    """The hook runs install() as ``import deepspeed`` starts, so DeepSpeed's own first pick
    is already the registry's (no 'Setting accelerator to CPU' from DeepSpeed's ladder).

    ``emu`` is an external plugin, loaded in a probe thread: install() must not run where Python
    holds its global import lock (a finder's ``find_spec``), or that thread's imports wait for
    the probe timeout and the backend is lost (the registry chose cpu after 60 s)."""
    code = (
        "import deepspeed, json\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "from accelreg.integrations.deepspeed import accelerator_report\n"
        "r = accelerator_report()\n"
        "print(json.dumps([get_accelerator()._name, r['how']]))\n"
    )
    # the emulator's first use in a session may build it (a minute on a loaded machine): inside
    # the probe here, so the probe timeout must not cut that off
    result = run_python(code, name=name, env={"ACCELREG_RUN": "1", "ACCELREG_PROBE_TIMEOUT": "900"})
    got, how = result.value
    assert got == name and how == f"handed over by accelreg (the registry chose {name})", (
        result.stdout + result.stderr
    )
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr


def test_the_start_hook_runs_before_the_module_and_outside_the_import_lock() -> None:
    """A callback that waits for an import in another thread (as the registry's probe threads
    do) must not run while Python holds its global import lock, and still runs before the
    watched module's own code; callbacks it queues for that module fire once it is imported."""
    code = (
        "import json, sys, threading\n"
        "from accelreg import importwatch\n"
        "seen = {}\n"
        "def start():\n"
        "    t = threading.Thread(target=__import__, args=('decimal',))\n"
        "    t.start(); t.join(20)\n"
        "    seen['other_thread_imported'] = not t.is_alive()\n"
        "    seen['before_its_code'] = not hasattr(sys.modules.get('tomllib'), 'loads')\n"
        "    importwatch.when_imported('tomllib', lambda m: seen.setdefault('after', hasattr(m, 'loads')))\n"
        "importwatch.before_first_import(['tomllib'], start)\n"
        "import tomllib\n"
        "print(json.dumps(seen))\n"
    )
    seen = run_python(code, name=None).value
    assert seen == {"other_thread_imported": True, "before_its_code": True, "after": True}


def _accelreg_run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelreg", "run", *args],
        capture_output=True,
        text=True,
        env=clean_environ(),
        timeout=timeout,
    )


def test_accelreg_run_needs_no_devices_and_marks_the_job() -> None:
    code = "import os, accelerate, json\n" + _ENABLED.replace("print(", "print(os.environ['ACCELREG_RUN'], ")
    proc = _accelreg_run("--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1 ") and json.loads(proc.stdout[2:])["accelerate"] is True


def test_accelreg_run_forwards_the_exit_status_and_signals() -> None:
    assert _accelreg_run("--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7
    killed = _accelreg_run(
        "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    )
    assert killed.returncode == -signal.SIGTERM  # the command itself got the signal: this process is it


def test_the_accelreg_run_wrapper_loads_neither_the_registry_nor_the_planner() -> None:
    """``accelreg run -- CMD`` is paid once per job before CMD starts: without --devices it needs
    no registry, plugin, runtime or planner (loading the whole CLI cost +355 ms against +98 ms:
    docs/benchmarks.md)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "accelreg", "run", "--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        env=clean_environ(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    # it did run the wrapper. The command modules themselves, imported through importlib, are not
    # timed by -X importtime, but what they import is: env, config and plan import the registry
    # or the planner at their top.
    assert "accelreg.launch.job" in loaded
    heavy = {"accelreg.registry", "accelreg.planner", "accelreg.meta", "pluggy", "torch"}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_accelreg_run_backend_without_devices_is_a_usage_error() -> None:
    proc = _accelreg_run("--backend", "cpu", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "--backend says whose devices --devices names" in proc.stderr


def test_a_process_under_accelreg_run_never_falls_back_to_the_cpu_silently() -> None:
    """ACCELREG_RUN counts as a launcher: a present but failing accelerator is an error there."""
    code = (
        "import accelreg\n"
        "try:\n    print(accelreg.resolve())\nexcept accelreg.DeviceError as e:\n    print('DeviceError', e)\n"
    )
    bad = {"ACCELREG_EMU_MEMORY": "not-a-size"}  # the emulated npu is installed but misconfigured
    outside = run_python(code, name="npu", env=bad)
    inside = run_python(code, name="npu", env={**bad, "ACCELREG_RUN": "1"})
    assert outside.stdout.strip() == "cpu" and "npu is present" in outside.stderr  # warned
    assert inside.stdout.startswith("DeviceError") and "ACCELREG_RUN=1" in inside.stdout
