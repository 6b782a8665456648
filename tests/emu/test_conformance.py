"""The backend conformance kit against the emulated accelerator under every name it takes, and
against accelreg's built-in plugins finding the impersonated runtime as they would the real one.

Each name needs its own process (PrivateUse1 is renamed once): the ``accelreg_emu`` marker
runs both classes of one name in one child.
"""

from __future__ import annotations

import functools

import pytest

from accelreg.testing import BackendConformance

pytestmark = pytest.mark.emu

# distinct sizes: the kit's mask check then also sees *which* physical device became logical 0
_KW = {"devices": 2, "memory": "256MiB,320MiB"}


@pytest.mark.slow  # the emulator's own name; the default run has npu through accelreg's built-in
@pytest.mark.accelreg_emu(name="emu", **_KW)
class TestEmu(BackendConformance):
    backend = "emu"
    # the emulator's own samples (comma syntax too); the kit's default is ("0", "1,0")
    visible_devices_samples = (("1", ("1",)), ("1,0", ("1", "0")), (" 0 , 1 ", ("0", "1")))

    def test_provider_is_the_emulator(self):
        import accelreg

        info = {b.name: b for b in accelreg.backends()}["emu"]
        assert info.provider == "accelreg-emu" and not info.builtin


def _classes(name: str, *, slow: bool = True):
    """The kit under ``name``, through the emulator's plugin and through accelreg's built-in; every
    name but npu in the slow group (tests/_matrix.py: one name in the default run), and npu
    through the emulator's plugin too (the default run keeps the built-in: accelreg's own code)."""

    def marker(cls: type, slow: bool = slow) -> type:
        cls = pytest.mark.accelreg_emu(name=name, **_KW)(cls)
        return pytest.mark.slow(cls) if slow else cls

    @functools.partial(marker, slow=True)
    class ViaPlugin(BackendConformance):
        """The accelreg-emu plugin provides the backend (it replaces the built-in)."""

        backend = name

        def test_replaces_the_builtin(self):
            import accelreg

            info = {b.name: b for b in accelreg.backends()}[name]
            assert info.provider == "accelreg-emu" and info.replaces and info.replaces.startswith("accelreg")

    @marker
    class ViaBuiltin(BackendConformance):
        """accelreg's own plugin finds the impersonated vendor runtime."""

        backend = name
        settings = {"disable": ["emu"]}  # noqa: RUF012

        def test_builtin_provides_it(self):
            import accelreg

            info = {b.name: b for b in accelreg.backends()}[name]
            assert info.builtin and info.provider == "accelreg" and info.available, info.reason

    return ViaPlugin, ViaBuiltin


TestNpuPlugin, TestNpuBuiltin = _classes("npu", slow=False)
TestMluPlugin, TestMluBuiltin = _classes("mlu")
TestMusaPlugin, TestMusaBuiltin = _classes("musa")
TestSdaaPlugin, TestSdaaBuiltin = _classes("sdaa")
TestHpuPlugin, TestHpuBuiltin = _classes("hpu")


# -- the kit catches runtimes that break the contract -------------------------------------------
_MASK_IGNORED = """
import accelreg
from accelreg.types import Availability, BackendSpec


def _available():
    import accelreg_emu

    accelreg_emu.activate()
    return Availability.yes("the emulator, masked by a variable it never reads")


def _count():
    import torch

    return torch.emu.device_count()


@accelreg.hookimpl
def accelreg_backends():
    yield BackendSpec(
        name="acme",
        priority=1,
        device_type="emu",
        is_available=_available,
        device_count=_count,
        visible_devices_var="ACME_VISIBLE_DEVICES",
    )
"""


def _emulated(monkeypatch: pytest.MonkeyPatch, site: object = None) -> None:
    import os

    monkeypatch.setenv("ACCELREG_EMU_NAME", "emu")
    monkeypatch.setenv("ACCELREG_EMU_DEVICES", "2")
    monkeypatch.setenv("ACCELREG_EMU_MEMORY", _KW["memory"])
    if site is not None:
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
        )


@pytest.mark.slow  # six masked interpreters; the default run has the kit's is_available check below
def test_the_kit_fails_a_runtime_that_ignores_its_visible_devices_variable(pytester, monkeypatch):
    """A vendor runtime that never reads the variable its plugin declares passed the kit before;
    every rank of a job would then share every device."""
    from tests._fakes import make_dist

    _emulated(
        monkeypatch,
        make_dist(pytester.path / "site", "acme-accel", "1.0", "acme_plugin", _MASK_IGNORED, "acme"),
    )
    pytester.makepyfile(
        """
        from accelreg.testing import BackendConformance

        class TestIgnoresItsMask(BackendConformance):
            backend = "acme"

        class TestHonoursItsMask(BackendConformance):
            backend = "emu"
        """
    )
    result = pytester.runpytest_subprocess("-k", "test_runtime_honours_its_visible_devices_variable")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*TestIgnoresItsMask*",
            "*ACME_VISIBLE_DEVICES='0'*torch.emu.device_count() is 2: the runtime ignores ACME_VISIBLE_DEVICES*",
        ]
    )


def test_the_kit_fails_an_is_available_that_raises(pytester, monkeypatch):
    _emulated(monkeypatch)
    pytester.makepyfile(
        """
        import pytest

        import accelreg
        from accelreg.testing import BackendConformance

        class TestRaises(BackendConformance):
            backend = "emu"

            @pytest.fixture(autouse=True)
            def _driver_not_ready(self, monkeypatch):
                import torch

                accelreg.device_count("emu")  # the runtime is up: torch.emu exists

                def is_available():
                    raise RuntimeError("driver not initialised")

                monkeypatch.setattr(torch.emu, "is_available", is_available)

        class TestAnswers(BackendConformance):
            backend = "emu"
        """
    )
    result = pytester.runpytest_subprocess("-k", "test_device_module_answers_is_available")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*TestRaises*", "*torch.emu.is_available() raised RuntimeError: driver not initialised*"]
    )


_SAYS_LITTLE = """
import accelreg
from accelreg.types import Availability, BackendSpec


def _available():
    import accelreg_emu

    accelreg_emu.activate()
    return Availability.yes("the emulator, under another plugin")


def _count():
    import torch

    return torch.emu.device_count()


@accelreg.hookimpl
def accelreg_backends():
    # declares nothing: its runtime must say, and (in the test) cannot
    yield BackendSpec(name="acme", priority=2, device_type="emu", is_available=_available, device_count=_count)
    # declares float8, which its runtime (in the test) cannot multiply
    yield BackendSpec(
        name="acme8",
        priority=1,
        device_type="emu",
        is_available=_available,
        device_count=_count,
        dtypes={"bfloat16": True, "float16": True, "float8_e4m3fn": True},
    )
"""


def test_the_kit_fails_unknown_bf16_and_a_dtype_claimed_but_not_computed(pytester, monkeypatch):
    from tests._fakes import make_dist

    _emulated(
        monkeypatch,
        make_dist(pytester.path / "site", "acme-accel", "1.0", "acme_dtypes", _SAYS_LITTLE, "acme"),
    )
    pytester.makepyfile(
        """
        import pytest
        import torch

        import accelreg
        from accelreg.testing import BackendConformance

        @pytest.fixture
        def flagless_runtime(monkeypatch):
            accelreg.device_count("emu")  # the runtime is up: torch.emu exists
            monkeypatch.delattr(torch.emu, "is_bf16_supported")
            monkeypatch.delattr(torch.emu, "get_amp_supported_dtype")

        @pytest.fixture
        def no_float8(monkeypatch):
            def scaled_mm(*args, **kwargs):
                raise RuntimeError("no float8 units")

            monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)

        @pytest.mark.usefixtures("flagless_runtime")
        class TestSaysNothing(BackendConformance):
            backend = "acme"

        @pytest.mark.usefixtures("no_float8")
        class TestClaimsFloat8(BackendConformance):
            backend = "acme8"

        class TestAnswers(BackendConformance):
            backend = "emu"
        """
    )
    result = pytester.runpytest_subprocess("-k", "test_compute_dtypes")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*emu:0: nobody says whether it computes in bfloat16*declare it in BackendSpec.dtypes*",
            "*emu:0: answered that it computes in float8_e4m3fn (declared by acme8's plugin (acme-accel)), but "
            "a scaled matrix multiply on float8_e4m3fn failed: RuntimeError: no float8 units*",
        ],
        consecutive=False,
    )
