"""accelreg's pytest plugin (entry point ``pytest11: accelreg``, through :mod:`accelreg.testing`).

It gives:

* the ``accelreg_fresh`` fixture — a registry rebuilt from a clean environment;
* the ``accelreg_emu(name="npu", devices=2, memory=None, timeout=600, **env)`` marker — the
  marked tests run in a fresh ``python -m pytest`` subprocess with the emulated accelerator
  presenting itself as ``name`` (one PrivateUse1 name per process; ``name=None``: a fresh process
  without the emulator); tests of one module with the same marker arguments share one
  subprocess, which gets ``timeout`` seconds for all of them. The parent only reports: the
  test's fixtures are set up in the child, never in the parent;
* :func:`run_python` / the ``emu_python`` fixture — run a code string in such a subprocess;

With pytest-xdist, the child runs without workers of its own (``-n 0``), and the tests of one
such group carry an ``xdist_group`` mark for ``--dist loadgroup`` (one child per group, as
without xdist); ``--dist loadfile`` keeps them on one worker anyway, and is what works with
pytest 9.2, whose node ids pytest-xdist 3.8's loadgroup can no longer tag (pytest-xdist#1386).

Nothing here imports torch until a test needs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import accelreg

from .child import run_python
from .environ import CHILD_VAR, MARKER_ENV_VAR, RESULTS_VAR, clean_environ, emu_environ, registry_vars

__all__ = ["accelreg_fresh", "emu_python", "pytest_collection_modifyitems", "pytest_configure"]


@pytest.fixture
def accelreg_fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A registry built from a clean environment, in an empty working directory.

    In a child started by the ``accelreg_emu`` marker, the variables the marker set (its
    ``**env``, e.g. a visible-devices mask) stay: they are the environment the test asked for.
    """
    for key in registry_vars() - _marker_env():
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    accelreg.reset()
    yield
    accelreg.reset()


@pytest.fixture
def emu_python() -> Any:
    """:func:`run_python`, as a fixture."""
    return run_python


def _marker_env() -> set[str]:
    """In a marker's child: the names of the variables the marker set; elsewhere nothing."""
    if not os.environ.get(CHILD_VAR):
        return set()
    return set(json.loads(os.environ.get(MARKER_ENV_VAR) or "[]"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "accelreg_emu(name='emu', devices=2, memory=None, timeout=600, **env): run in a subprocess "
        "whose emulated accelerator presents itself as `name` with `devices` devices (name=None: "
        "no emulator); the tests of a module with the same arguments share one subprocess",
    )
    if os.environ.get(RESULTS_VAR):
        config.pluginmanager.register(_ChildReporter(os.environ[RESULTS_VAR]), "accelreg-child-reporter")


class _ChildReporter:
    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "longrepr": str(report.longrepr) if report.longrepr else "",
            "skip": list(report.longrepr) if report.skipped and isinstance(report.longrepr, tuple) else None,
            "sections": [list(s) for s in report.sections if s[0].startswith("Captured std")],
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def _marker_key(item: pytest.Item) -> tuple[str, str] | None:
    mark = item.get_closest_marker("accelreg_emu")
    if mark is None:
        return None
    kwargs = dict(mark.kwargs)
    if mark.args:
        kwargs.setdefault("name", mark.args[0])
    return item.nodeid.split("::", 1)[0], json.dumps(kwargs, sort_keys=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup rewrites the node ids
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if os.environ.get(CHILD_VAR):
        return
    groups: dict[tuple[str, str], list[pytest.Item]] = {}
    for item in items:
        key = _marker_key(item)
        if key is not None:
            groups.setdefault(key, []).append(item)
    xdist = config.pluginmanager.hasplugin("xdist")
    timeouts = config.pluginmanager.hasplugin("timeout")
    for key, members in groups.items():
        group = _Group(config, key, [m.nodeid for m in members], xdist=xdist)
        digest = hashlib.sha1(key[1].encode()).hexdigest()[:10]
        own_groups = any(m.get_closest_marker("xdist_group") for m in members)
        for item in members:
            item.runtest = _delegate(group, item.nodeid)  # type: ignore[method-assign]
            item.setup = _parent_setup  # type: ignore[method-assign]
            if xdist and not own_groups:
                item.add_marker(pytest.mark.xdist_group(f"accelreg_emu:{key[0]}:{digest}"))
            if timeouts and item.get_closest_marker("timeout") is None:
                # the first test of the group waits for the whole child: the group's timeout
                # governs it, with a margin for the child's start and its report
                item.add_marker(pytest.mark.timeout(group.timeout + 60))


def _parent_setup() -> None:
    """A delegated test's fixtures are the child's: the parent sets up none of them."""


class _Group:
    """Marked tests of one module sharing marker arguments: one child pytest runs them all."""

    def __init__(
        self, config: pytest.Config, key: tuple[str, str], nodeids: list[str], *, xdist: bool
    ) -> None:
        self.rootdir = str(config.rootpath)
        self.kwargs = json.loads(key[1])
        self.timeout = float(self.kwargs.get("timeout", 600))
        self.nodeids = nodeids
        self.xdist = xdist
        self.results: dict[str, list[dict[str, Any]]] | None = None
        self.output = ""
        self.problem = ""  # the child was stopped before it ran every test
        self.crashed = ""  # the child ran them but did not exit cleanly

    def environ(self, results_path: str) -> dict[str, str]:
        kwargs = dict(self.kwargs)
        name = kwargs.pop("name", "emu")
        devices = int(kwargs.pop("devices", 2))
        memory = kwargs.pop("memory", None)
        kwargs.pop("timeout", None)
        extra = {k: str(v) for k, v in kwargs.items()}
        if name is None:  # a fresh process without the emulator
            env = clean_environ(extra)
            env.pop("ACCELREG_EMU_NAME", None)
        else:
            env = emu_environ(name, devices, memory, **extra)
        for key in [k for k in env if k.startswith("PYTEST_XDIST_")]:
            del env[key]  # the child is no xdist worker, even when its parent is one
        env.update({CHILD_VAR: "1", RESULTS_VAR: results_path, MARKER_ENV_VAR: json.dumps(sorted(extra))})
        return env

    def run(self) -> dict[str, list[dict[str, Any]]]:
        if self.results is not None:
            return self.results
        self.results = {}  # never started twice, whatever happens below
        with tempfile.TemporaryDirectory(prefix="accelreg-child-") as tmp:
            results_path = os.path.join(tmp, "results.jsonl")
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header"]
            if self.xdist:
                cmd += ["-n", "0"]  # the child runs its tests itself, whatever addopts says
            proc = subprocess.Popen(
                [*cmd, *self.nodeids],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.environ(results_path),
                cwd=self.rootdir,
                start_new_session=os.name == "posix",  # its own process group: stopped as a whole
            )
            try:
                out, err = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _stop(proc)
                out, err = proc.communicate()
                self.problem = f"the child ran past its timeout of {self.timeout:g} s and was stopped"
            except BaseException:
                _stop(proc)
                proc.communicate()
                self.problem = "the child was stopped: the parent was interrupted"
                raise
            finally:
                self.results = _read_results(results_path)
            self.output = (out or "")[-6000:] + (err or "")[-6000:]
            if not self.problem and proc.returncode not in (0, 1):  # 1: some test failed
                # a crash (an abort at interpreter shutdown, a signal, an internal error) fails
                # every test of the group, as a plain run of that process would have
                self.crashed = f"the child exited with status {proc.returncode}"
        return self.results


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop the child and every process it started (its process group)."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _read_results(path: str) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                results.setdefault(entry["nodeid"], []).append(entry)
    return results


def _delegate(group: _Group, nodeid: str) -> Any:
    def runtest() -> None:
        reports = group.run().get(nodeid)
        name = group.kwargs.get("name", "emu")
        label = f"[child: emulator {name!r} x {group.kwargs.get('devices', 2)}]" if name else "[child]"
        if not reports:
            why = f"{group.problem} before it ran" if group.problem else "the child never ran"
            pytest.fail(f"{label} {why} {nodeid}\n{group.output}", pytrace=False)
        for report in reports:  # what the test printed, for -s and -rP as if it ran here
            for title, text in report.get("sections", []):
                if title.endswith(f" {report['when']}"):
                    (sys.stderr if "stderr" in title else sys.stdout).write(text)
        for report in reports:
            if report["outcome"] == "failed":
                pytest.fail(f"{label} {report['when']} failed:\n{report['longrepr']}", pytrace=False)
        if group.crashed:
            pytest.fail(
                f"{label} {group.crashed} (this test: {reports[-1]['outcome']})\n{group.output}",
                pytrace=False,
            )
        if group.problem and not any(r["when"] == "teardown" for r in reports):
            pytest.fail(f"{label} {group.problem} during {nodeid}\n{group.output}", pytrace=False)
        for report in reports:
            if report["outcome"] == "skipped":
                reason = report["skip"][2] if report["skip"] else report["longrepr"]
                pytest.skip(f"{label} {reason}")

    return runtest
