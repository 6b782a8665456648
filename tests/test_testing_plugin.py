"""accelreg's pytest plugin: the accelreg_emu marker runs tests in a child with the emulator env."""

from __future__ import annotations

import os
import signal
import time

import pytest

from accelreg.testing import CHILD_VAR, clean_environ, run_python


@pytest.mark.accelreg_emu(name="mlu", devices=3, memory="1GiB")
def test_marked_test_runs_in_a_child_with_the_emulator_environment():
    assert os.environ[CHILD_VAR] == "1"
    assert os.environ["ACCELREG_EMU_NAME"] == "mlu"
    assert os.environ["ACCELREG_EMU_DEVICES"] == "3"
    assert os.environ["ACCELREG_EMU_MEMORY"] == "1GiB"


@pytest.mark.accelreg_emu(name="mlu", devices=3, memory="1GiB")
def test_same_marker_same_child():
    assert os.environ[CHILD_VAR] == "1"
    assert os.getppid() != os.getpid()


def test_child_failures_and_skips_reach_the_parent(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.accelreg_emu(name="npu")
        def test_fails():
            assert 1 == 2, "child says no"

        @pytest.mark.accelreg_emu(name="npu")
        def test_skips():
            pytest.skip("no widget here")

        @pytest.mark.accelreg_emu(name="npu")
        def test_passes():
            import os
            assert os.environ["ACCELREG_EMU_NAME"] == "npu"
        """
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*child says no*", "*no widget here*"])


def test_clean_environ_drops_registry_variables(monkeypatch):
    monkeypatch.setenv("ACCELREG_PRIORITY", "npu")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("ACCELREG_EMU_NAME", "npu")
    env = clean_environ()
    assert "ACCELREG_PRIORITY" not in env and "LOCAL_RANK" not in env
    assert env["ACCELREG_EMU_NAME"] == "npu"


def test_run_python_reports_child_output():
    assert run_python("print(6 * 7)", name=None).value == 42
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        run_python("1 / 0", name=None)


_PLUS_SYNTAX_PLUGIN = """
import accelreg
from accelreg.types import BackendSpec


def parse(value):
    # "card1+card0": this runtime's own syntax, which the default comma parser rejects
    ids = tuple(part.strip().removeprefix("card") for part in value.split("+") if part.strip())
    if not all(i.isdecimal() for i in ids):
        raise ValueError(f"ACME_VISIBLE_DEVICES={value!r} is not card<N>+card<M>...")
    return ids


@accelreg.hookimpl
def accelreg_backends():
    yield BackendSpec(
        name="acme",
        priority=75,
        device_type="mtia",
        is_available=lambda: True,
        device_count=lambda: 2,
        visible_devices_var="ACME_VISIBLE_DEVICES",
        parse_visible_devices=parse,
    )
"""


def test_conformance_kit_takes_the_vendors_visible_devices_syntax(pytester, monkeypatch):
    from tests._fakes import make_dist

    root = make_dist(pytester.path / "site", "acme-accel", "1.0", "acme_plugin", _PLUS_SYNTAX_PLUGIN, "acme")
    monkeypatch.setenv("PYTHONPATH", str(root))
    pytester.makepyfile(
        """
        from accelreg.testing import BackendConformance

        class TestOwnSyntax(BackendConformance):
            backend = "acme"
            visible_devices_samples = (("card0", ("0",)), ("card1+card0", ("1", "0")))

        class TestCommaDefault(BackendConformance):
            backend = "acme"
        """
    )
    result = pytester.runpytest_subprocess("-k", "test_visible_devices_parsing")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*TestCommaDefault*",
            "*ACME_VISIBLE_DEVICES='1,0' parsed as*set visible_devices_samples*",
        ]
    )


@pytest.mark.accelreg_emu(name="npu", ASCEND_RT_VISIBLE_DEVICES="1", ACCELREG_PRIORITY="npu,cpu")
def test_the_markers_own_variables_survive_the_fresh_registry():
    """tests/conftest.py gives every test ``accelreg_fresh``, which clears the registry's
    variables; in the child it keeps those the marker set (the environment the test asked for)."""
    assert os.environ["ASCEND_RT_VISIBLE_DEVICES"] == "1" and os.environ["ACCELREG_PRIORITY"] == "npu,cpu"


@pytest.mark.accelreg_emu(name=None)
def test_name_none_is_a_child_without_the_emulator():
    assert os.environ[CHILD_VAR] == "1" and "ACCELREG_EMU_NAME" not in os.environ


_GROUPS = """
import atexit, os, subprocess, sys, time

import pytest

PIDS = os.environ["PIDS_FILE"]


@pytest.fixture(scope="module")
def only_in_the_child():
    assert os.environ.get("ACCELREG_TESTING_CHILD") == "1", "a fixture was set up in the parent"
    return "child"


@pytest.mark.accelreg_emu(name=None)
def test_fixtures_are_set_up_in_the_child_only(only_in_the_child):
    print("hello from the child")
    assert only_in_the_child == "child"


@pytest.mark.accelreg_emu(name="npu", timeout=20)
def test_stuck():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(PIDS, "a") as fh:
        fh.write(f"{sleeper.pid}\\n")
    time.sleep(600)


@pytest.mark.accelreg_emu(name="npu", timeout=20)
def test_after_the_stuck_one():
    pass


@pytest.mark.accelreg_emu(name="mlu")
def test_passes_then_the_child_crashes_at_exit():
    atexit.register(os._exit, 7)
"""


def test_fixtures_output_timeout_and_crash_of_a_child(pytester, tmp_path):
    """Fixtures of a delegated test run in the child only; its output reaches ``-rP``; a group
    past its ``timeout`` is stopped with every process it started, and neither it nor the tests
    after it run twice; a child that ran its tests but crashed fails them."""
    pids = tmp_path / "pids"
    pytester.makepyfile(_GROUPS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIDS_FILE", str(pids))
        result = pytester.runpytest_subprocess("-rP", "-p", "no:xdist", "-p", "no:timeout")
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*the child ran past its timeout of 20 s and was stopped during *::test_stuck",
            "*the child ran past its timeout of 20 s and was stopped before it ran *::test_after_the_stuck_one",
            "*the child exited with status 7 (this test: passed)*",
            "*hello from the child*",
        ]
    )
    (pid,) = map(int, pids.read_text().split())  # the stuck test ran once
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the grandchild of the stopped child is still running")


_XDIST = """
import os

import pytest


def _record(tag):
    with open(os.environ["PIDS_FILE"], "a") as fh:
        fh.write(f"{tag} {os.getpid()} {os.environ.get('PYTEST_XDIST_WORKER', '-')}\\n")


@pytest.mark.accelreg_emu(name="npu")
@pytest.mark.parametrize("i", range(3))
def test_npu(i):
    _record("npu")


@pytest.mark.accelreg_emu(name="mlu")
@pytest.mark.parametrize("i", range(3))
def test_mlu(i):
    _record("mlu")


@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    pass
"""


def test_under_xdist_a_group_stays_in_one_child_without_workers_of_its_own(pytester, tmp_path):
    """Each group carries an ``xdist_group`` mark (for ``--dist loadgroup``); run with workers
    (``-n 2`` in addopts, ``--dist loadfile``), each group still has one child, and the child
    runs its tests itself: it is no xdist worker and starts none."""
    pids = tmp_path / "pids"
    pytester.makeini("[pytest]\naddopts = -n 2 --dist loadfile\n")
    pytester.makepyfile(_XDIST)
    items, _ = pytester.inline_genitems("-n", "0")
    groups = {item.name: [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert len({g[0] for name, g in groups.items() if name.startswith("test_npu")}) == 1, groups
    assert len({g[0] for g in groups.values() if g}) == 2 and not groups["test_plain[0]"], groups
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIDS_FILE", str(pids))
        result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=10)
    rows = [line.split() for line in pids.read_text().splitlines()]
    assert sorted(tag for tag, _, _ in rows) == ["mlu"] * 3 + ["npu"] * 3
    for tag in ("npu", "mlu"):
        assert len({pid for t, pid, _ in rows if t == tag}) == 1, rows  # one child per group
    assert {worker for _, _, worker in rows} == {"-"}, rows  # the children are no xdist workers
