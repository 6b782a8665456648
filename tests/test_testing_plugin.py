"""accelreg's pytest plugin: the accelreg_emu marker runs tests in a child with the emulator env."""

from __future__ import annotations

import os

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
