"""The backend conformance kit against the emulated accelerator under every name it takes, and
against accelreg's built-in plugins finding the impersonated runtime as they would the real one.

Each name needs its own process (PrivateUse1 is renamed once): the ``accelreg_emu`` marker
runs both classes of one name in one child.
"""

from __future__ import annotations

import pytest

from accelreg.testing import BackendConformance

pytestmark = pytest.mark.emu

_KW = {"devices": 2, "memory": "256MiB"}


@pytest.mark.accelreg_emu(name="emu", **_KW)
class TestEmu(BackendConformance):
    backend = "emu"
    # the emulator's own samples (comma syntax too); the kit's default is ("0", "1,0")
    visible_devices_samples = (("1", ("1",)), ("1,0", ("1", "0")), (" 0 , 1 ", ("0", "1")))

    def test_provider_is_the_emulator(self):
        import accelreg

        info = {b.name: b for b in accelreg.backends()}["emu"]
        assert info.provider == "accelreg-emu" and not info.builtin


def _classes(name: str):
    marker = pytest.mark.accelreg_emu(name=name, **_KW)

    @marker
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


TestNpuPlugin, TestNpuBuiltin = _classes("npu")
TestMluPlugin, TestMluBuiltin = _classes("mlu")
TestMusaPlugin, TestMusaBuiltin = _classes("musa")
TestSdaaPlugin, TestSdaaBuiltin = _classes("sdaa")
TestHpuPlugin, TestHpuBuiltin = _classes("hpu")
