"""accelreg's pytest plugin (entry point ``pytest11: accelreg``, through :mod:`accelreg.testing`).

It gives:

* the ``accelreg_fresh`` fixture — a registry rebuilt from a clean environment;
* the ``accelreg_emu(name="npu", devices=2, memory=None, **env)`` marker — the marked tests run
  in a fresh ``python -m pytest`` subprocess with the emulated accelerator presenting itself as
  ``name`` (one PrivateUse1 name per process); tests of one module with the same marker
  arguments share one subprocess;
* :func:`run_python` / the ``emu_python`` fixture — run a code string in such a subprocess;

Nothing here imports torch until a test needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import accelreg

from .child import run_python
from .environ import CHILD_VAR, RESULTS_VAR, emu_environ, registry_vars

__all__ = ["accelreg_fresh", "emu_python", "pytest_collection_modifyitems", "pytest_configure"]


@pytest.fixture
def accelreg_fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A registry built from a clean environment, in an empty working directory."""
    for key in registry_vars():
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "accelreg_emu(name='emu', devices=2, memory=None, **env): run in a subprocess whose emulated "
        "accelerator presents itself as `name` with `devices` devices",
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
    for key, members in groups.items():
        group = _Group(config, key, [m.nodeid for m in members])
        for item in members:
            item.runtest = _delegate(group, item.nodeid)  # type: ignore[method-assign]


class _Group:
    """Marked tests of one module sharing marker arguments: one child pytest runs them all."""

    def __init__(self, config: pytest.Config, key: tuple[str, str], nodeids: list[str]) -> None:
        self.rootdir = str(config.rootpath)
        self.kwargs = json.loads(key[1])
        self.nodeids = nodeids
        self.results: dict[str, list[dict[str, Any]]] | None = None
        self.output = ""

    def run(self) -> dict[str, list[dict[str, Any]]]:
        if self.results is not None:
            return self.results
        kwargs = dict(self.kwargs)
        name = kwargs.pop("name", "emu")
        devices = int(kwargs.pop("devices", 2))
        memory = kwargs.pop("memory", None)
        timeout = float(kwargs.pop("timeout", 600))
        with tempfile.TemporaryDirectory(prefix="accelreg-child-") as tmp:
            results_path = os.path.join(tmp, "results.jsonl")
            env = emu_environ(name, devices, memory, **kwargs)
            env.update({CHILD_VAR: "1", RESULTS_VAR: results_path})
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--no-header",
                *self.nodeids,
            ]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=self.rootdir, timeout=timeout
            )
            self.output = proc.stdout[-6000:] + proc.stderr[-6000:]
            results: dict[str, list[dict[str, Any]]] = {}
            if os.path.exists(results_path):
                with open(results_path, encoding="utf-8") as fh:
                    for line in fh:
                        entry = json.loads(line)
                        results.setdefault(entry["nodeid"], []).append(entry)
        self.results = results
        return results


def _delegate(group: _Group, nodeid: str) -> Any:
    def runtest() -> None:
        reports = group.run().get(nodeid)
        label = f"[child: emulator {group.kwargs.get('name', 'emu')!r} x {group.kwargs.get('devices', 2)}]"
        if not reports:
            pytest.fail(f"{label} the child never ran {nodeid}:\n{group.output}", pytrace=False)
        for report in reports:
            if report["outcome"] == "failed":
                pytest.fail(f"{label} {report['when']} failed:\n{report['longrepr']}", pytrace=False)
        for report in reports:
            if report["outcome"] == "skipped":
                reason = report["skip"][2] if report["skip"] else report["longrepr"]
                pytest.skip(f"{label} {reason}")

    return runtest
