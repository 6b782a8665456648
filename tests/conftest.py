"""Session set-up of the suite: the emulator's build cache, a fresh registry for every test, and
how pytest-xdist shares the work (``-n auto --dist loadfile`` in pyproject's addopts).

With workers, the tests of one file run on one worker (module-scoped fixtures and the
``accelreg_emu`` marker's child start once), files that share session-scoped helper processes
run on one worker together (``SHARED_SCOPES``), and a worker that asks for work gets the file
that took longest in the previous run (``.pytest_cache``; without one, ``DEFAULT_SECONDS``), so
the slowest ones do not end up last and alone.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import pytest

from accelreg.testing import CHILD_VAR

pytest_plugins = ["pytester"]

#: Test files whose tests share session-scoped helper processes, so that with pytest-xdist they
#: run on one worker and each process starts once: tests/deepspeed/conftest.py's "none",
#: "install" and "deepspeed" runs serve both of these files.
SHARED_SCOPES = {
    "tests/deepspeed/test_seed000.py": "tests/deepspeed (none, install and deepspeed runs)",
    "tests/deepspeed/test_roundtrip.py": "tests/deepspeed (none, install and deepspeed runs)",
}
_SECONDS_KEY = "accelreg/xdist-scope-seconds"
#: Seconds of the longest scopes (measured on two cores on 2026-12-05, ``python -m pytest``; the
#: figures the cache keeps), for a run without the previous run's figures (a fresh clone,
#: ``-p no:cacheprovider``): only the order they give counts.
DEFAULT_SECONDS = {
    "tests/emu/test_ray.py": 320,
    "tests/deepspeed/test_launcher.py": 135,
    "tests/slurm/test_cluster.py": 130,
    "tests/emu/test_conformance.py": 130,
    "tests/test_docs.py": 125,
    "tests/emu/test_integrations.py": 125,
    "tests/deepspeed (none, install and deepspeed runs)": 95,
    "tests/test_testing_plugin.py": 85,
    "tests/integrations/test_common.py": 65,
    "tests/emu/test_emu_vendors.py": 65,
    "tests/deepspeed/test_zero.py": 65,
    "tests/test_startup.py": 60,
    "tests/test_planner_archs.py": 55,
    "tests/emu/test_patch_free_dispatch.py": 55,
    "tests/emu/test_lightning_emu.py": 55,
    "tests/test_cli.py": 45,
    "tests/deepspeed/test_multinode.py": 35,
    "tests/test_env_report.py": 30,
    "tests/emu/test_launch.py": 30,
    "tests/emu/test_parity.py": 25,
    "tests/test_import_safety.py": 25,
    "tests/integrations/transformers/test_transformers.py": 25,
}


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_SCOPES.get(path, path)


#: Variables pytest-xdist's workers get from their start-up rather than from the session (a
#: worker finds COLUMNS=80 and LINES=24 set, and accelreg's CLI wraps its tables to COLUMNS).
_SESSION_VARS = ("COLUMNS", "LINES")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help="run every test: also those marked slow (end-to-end runs: clusters, launchers, "
        "training, every emulated name), which the default run leaves out to stay within five "
        "minutes on two cores; CI runs them (.ci/run)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run leaves out the ``slow`` group; ``--full`` keeps it, and so does any ``-m``
    expression (it chooses for itself: ``-m slow`` runs that group alone). A child the
    ``accelreg_emu`` marker started runs exactly the tests its parent sent."""
    if config.getoption("--full") or config.getoption("markexpr") or os.environ.get(CHILD_VAR):
        return
    kept = [item for item in items if item.get_closest_marker("slow") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("slow")])
        items[:] = kept


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: tell each worker the terminal variables this session was started with."""
    node.workerinput["accelreg_session_vars"] = {k: os.environ.get(k) for k in _SESSION_VARS}


def pytest_configure(config: pytest.Config) -> None:
    """Build the emulated accelerator (and keep matplotlib's font cache) in the checkout's
    pytest cache, not ``~/.cache``.

    Set once per session (children started by the tests inherit it), so the extension is built
    at most once per checkout and source hash; an ``ACCELREG_EMU_CACHE`` the caller set wins.
    Without the cache provider (``-p no:cacheprovider``) it goes under pytest's base temporary
    directory, built once for that session. pytest-xdist's workers inherit both from the
    session, and get its terminal variables back (``pytest_configure_node``).
    """
    for var, value in getattr(config, "workerinput", {}).get("accelreg_session_vars", {}).items():
        if value is None:
            os.environ.pop(var, None)  # a worker runs its tests as the session would
        else:
            os.environ[var] = value
    cache = getattr(config, "cache", None)
    for var, name in (("ACCELREG_EMU_CACHE", "accelreg-emu"), ("MPLCONFIGDIR", "matplotlib")):
        if os.environ.get(var):
            continue
        if cache is not None:
            where = cache.mkdir(name)
        else:
            from _pytest.tmpdir import TempPathFactory

            where = TempPathFactory.from_config(config, _ispytest=True).mktemp(name, numbered=False)
        os.environ[var] = str(where)
    if not hasattr(config, "workerinput") and not os.environ.get(CHILD_VAR):
        _build_the_emulator()


def _build_the_emulator() -> None:
    """Build the emulated accelerator once, before any test runs, where its cache lacks it.

    Otherwise the first test to bring the emulator up builds it inside a registry probe, and on a
    loaded machine the build (about 25 s on two idle cores, minutes under load) outlasts the 60 s
    probe timeout: the backend is then reported unavailable and the test sees the cpu.
    """
    import importlib.util
    import subprocess

    if importlib.util.find_spec("accelreg_emu") is None:
        return
    from accelreg_emu.__main__ import VARIANTS
    from accelreg_emu._build import library_path

    missing = [v for v in VARIANTS if not library_path(v).exists()]
    if missing:
        print(f"accelreg-emu: building {', '.join(missing)} before the tests", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "accelreg_emu", "build", *missing],
            check=True,
            timeout=1800,
            stdout=subprocess.DEVNULL,
        )


@pytest.fixture(autouse=True)
def fresh_registry(accelreg_fresh):
    """Every test starts from a registry built from a clean environment in an empty folder
    (the ``accelreg_fresh`` fixture of accelreg's pytest plugin); plugin modules the test
    imported are forgotten afterwards."""
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name.startswith("fakeplugin"):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the shared scopes, the longest scope first (pytest-xdist only)."""
    if config.getoption("dist") != "loadfile":
        return None  # another mode was asked for: pytest-xdist's own scheduler
    from xdist.scheduler import LoadFileScheduling

    cache = getattr(config, "cache", None)
    seconds: dict[str, float] = {**DEFAULT_SECONDS, **(cache.get(_SECONDS_KEY, {}) if cache else {})}

    class Scheduler(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if len(self.workqueue) > 1:
                longest = max(self.workqueue, key=lambda scope: seconds.get(scope, 0.0))
                self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return Scheduler(config, log)


_RUN_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per scope in this run (in the controller, also the workers' reports)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    scope = _scope(report.nodeid)
    _RUN_SECONDS[scope] = _RUN_SECONDS.get(scope, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is None or os.environ.get("PYTEST_XDIST_WORKER") or not _RUN_SECONDS:
        return
    seconds = cache.get(_SECONDS_KEY, {})
    seconds.update({scope: round(s, 2) for scope, s in _RUN_SECONDS.items()})
    cache.set(_SECONDS_KEY, seconds)


#: Summary sections the workers' conftests asked for (``workeroutput["accelreg_summary"]``: title ->
#: lines), written by the controller, which has the terminal.
_WORKER_SUMMARY: dict[str, list[str]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for title, lines in getattr(node, "workeroutput", {}).get("accelreg_summary", {}).items():
        _WORKER_SUMMARY.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for title, lines in _WORKER_SUMMARY.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
