"""vLLM's platform follows the registry: selection, arbitration between platform plugins,
failing plugins, bad declarations, and the device-control variable.

These run against vLLM's real ``vllm.platforms`` (in-process, calling the function vLLM
resolves ``current_platform`` with) and fake platform plugins installed as distributions on
``sys.path`` (tests/vllm/_fakes.py). They need vLLM: ``nox -s vllm`` runs them in its layer;
elsewhere they skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here (nox -s vllm runs these in its layer)", allow_module_level=True)

import accelreg
from accelreg import registry
from accelreg.errors import DeviceError, PluginError
from accelreg.testing import emu_environ

from . import _fakes


@pytest.fixture(scope="module")
def platforms():
    """``vllm.platforms``, imported once (a second or two)."""
    import vllm.platforms

    return vllm.platforms


@pytest.fixture
def ar_vllm(monkeypatch, platforms):
    """accelreg's vLLM integration, enabled for the test (and disabled after it)."""
    from accelreg.integrations import vllm as integration

    monkeypatch.delenv("ACCELREG_AUTO_INSTALL", raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    integration.disable()
    integration.enable()
    yield integration
    integration.disable()


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """``plugins("alpha", "beta")`` puts those fake vLLM platform plugins on ``sys.path``."""

    def put(*names: str) -> None:
        for folder in _fakes.install(tmp_path / "plugins", *names):
            monkeypatch.syspath_prepend(str(folder))

    return put


def _resolve(platforms) -> str:
    """What vLLM would instantiate as ``current_platform`` in this process now."""
    return platforms.resolve_current_platform_cls_qualname()


def test_the_registry_priority_decides_between_two_active_platform_plugins(
    ar_vllm, plugins, platforms, monkeypatch
):
    plugins("alpha", "beta")
    _fakes.register(_fakes.backend("alpha", 90, "alpha"), _fakes.backend("beta", 80, "beta"))
    # stock vLLM: two active out-of-tree platforms are an error
    ar_vllm.disable()
    with pytest.raises(RuntimeError, match="Only one platform plugin can be activated"):
        _resolve(platforms)
    ar_vllm.enable()
    assert _resolve(platforms) == "fakeplugin_alpha.AlphaPlatform"
    made = ar_vllm.choice()
    assert (made.backend, made.platform) == ("alpha", "alpha")
    assert "alpha is the first available backend by default plugin priorities" in made.why
    assert "declares the vLLM platform 'alpha' (plugin 'alpha' of fake-alpha 1.0)" in made.why
    states = {p.name: p.state for p in made.plugins}
    assert states["alpha"] == "active: fakeplugin_alpha.AlphaPlatform"
    assert states["beta"] == "active: fakeplugin_beta.BetaPlatform"
    # the user's priority decides the other way round, in a fresh process (here: re-enabled)
    ar_vllm.disable()
    monkeypatch.setenv("ACCELREG_PRIORITY", "beta,alpha")
    accelreg.reset()
    _fakes.register(_fakes.backend("alpha", 90, "alpha"), _fakes.backend("beta", 80, "beta"))
    ar_vllm.enable()
    assert _resolve(platforms) == "fakeplugin_beta.BetaPlatform"
    assert "by configured priority" in ar_vllm.choice().why


def test_a_backend_without_a_vllm_platform_gets_the_registry_platform(ar_vllm, platforms):
    _fakes.register(_fakes.backend("acme", 95))
    assert _resolve(platforms) == "accelreg.integrations.vllm.platform.platform"
    made = ar_vllm.choice()
    assert (made.backend, made.platform) == ("acme", "registry")
    assert "declares no vLLM platform of its own: accelreg's registry platform serves it" in made.why


def test_cpu_gets_vllms_own_cpu_platform(ar_vllm, platforms):
    assert _resolve(platforms) == "vllm.platforms.cpu.CpuPlatform"
    made = ar_vllm.choice()
    assert (made.backend, made.platform) == ("cpu", "cpu")
    assert {p.name: p.state for p in made.plugins}["cpu"] == "active: vllm.platforms.cpu.CpuPlatform"


def test_a_declared_list_takes_the_first_active_platform(ar_vllm, plugins, platforms):
    plugins("sleepy", "beta")
    _fakes.register(_fakes.backend("acme", 95, ("sleepy", "beta")))
    assert _resolve(platforms) == "fakeplugin_beta.BetaPlatform"


def test_no_active_declared_platform_is_an_error_naming_each(ar_vllm, plugins, platforms):
    plugins("sleepy")
    _fakes.register(_fakes.backend("acme", 95, "sleepy"))
    with pytest.raises(
        DeviceError, match=r"none of its vLLM platforms is active here: sleepy \(fake-sleepy 1.0\)"
    ):
        _resolve(platforms)


def test_a_platform_plugin_that_fails_to_load_is_recorded(ar_vllm, plugins, platforms):
    plugins("broken", "alpha")
    _fakes.register(_fakes.backend("alpha", 90, "alpha"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _resolve(platforms) == "fakeplugin_alpha.AlphaPlatform"
    failures = [f for f in registry.get().failures if f.plugin == "broken"]
    assert len(failures) == 1
    f = failures[0]
    assert (f.distribution, f.version, f.stage) == ("fake-broken", "1.0", "vLLM platform plugin import")
    assert "fakeplugin_never_installed" in f.error
    assert any("vLLM platform plugin 'broken' failed to load" in str(w.message) for w in caught)
    assert {p.name: p.state for p in ar_vllm.choice().plugins}["broken"].startswith("failed to load: ")


def test_a_failing_platform_plugin_under_accelreg_run_is_a_device_error(
    ar_vllm, plugins, platforms, monkeypatch
):
    """Under a launcher the cpu is never chosen silently past a broken platform plugin."""
    plugins("raising")
    monkeypatch.setenv("ACCELREG_RUN", "1")
    accelreg.reset()
    with pytest.raises(
        DeviceError, match=r"'raising' failed: RuntimeError: the raising driver is gone.*launcher"
    ):
        _resolve(platforms)
    f = next(f for f in registry.get().failures if f.plugin == "raising")
    assert (f.distribution, f.stage) == ("fake-raising", "vLLM platform plugin activation")


def test_the_chosen_backends_failing_platform_is_a_device_error_everywhere(ar_vllm, plugins, platforms):
    plugins("raising")
    _fakes.register(_fakes.backend("acme", 95, "raising"))
    with pytest.raises(
        DeviceError,
        match=r"the registry chose acme, whose vLLM platform 'raising' \(fake-raising 1.0\) failed",
    ):
        _resolve(platforms)


def test_strict_mode_turns_a_platform_plugin_failure_into_an_error(ar_vllm, plugins, platforms, monkeypatch):
    plugins("broken")
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    accelreg.reset()
    with pytest.raises(PluginError, match="broken"):
        _resolve(platforms)


def test_an_unknown_platform_name_is_an_error_naming_the_plugin(ar_vllm, platforms):
    _fakes.register(_fakes.backend("acme", 95, "nosuch"), name="acme-plugin")
    with pytest.raises(DeviceError) as info:
        _resolve(platforms)
    message = str(info.value)
    assert (
        "backend 'acme' (plugin 'acme-plugin' of <registered>) declares the vLLM platform 'nosuch'" in message
    )
    assert "neither one of vLLM's own (tpu, cuda, rocm, xpu, cpu) nor an installed platform plugin" in message
    assert "ACCELREG_VLLM_PLATFORM=registry" in message


def test_a_platform_class_that_does_not_import_is_an_error_naming_the_plugin(ar_vllm, plugins, platforms):
    plugins("badclass")
    _fakes.register(_fakes.backend("acme", 95, "badclass"), name="acme-plugin")
    with pytest.raises(DeviceError) as info:
        _resolve(platforms)
    message = str(info.value)
    assert "the vLLM platform 'badclass' (fake-badclass 1.0): its platform class" in message
    assert "'fakeplugin_badclass_gone.GonePlatform' does not import (ModuleNotFoundError" in message
    assert "declared by backend 'acme' (plugin 'acme-plugin' of <registered>)" in message


def test_a_declared_class_path_that_does_not_import_names_the_plugin(ar_vllm, platforms):
    _fakes.register(_fakes.backend("acme", 95, "vllm_acme_gone.platform.AcmePlatform"), name="acme-plugin")
    with pytest.raises(
        DeviceError, match=r"'vllm_acme_gone.platform.AcmePlatform' does not import.*'acme-plugin'"
    ):
        _resolve(platforms)


def test_vllm_plugins_leaving_out_the_chosen_platform_is_an_error(ar_vllm, plugins, platforms, monkeypatch):
    plugins("alpha")
    monkeypatch.setenv("VLLM_PLUGINS", "beta")
    _fakes.register(_fakes.backend("alpha", 90, "alpha"))
    with pytest.raises(DeviceError, match=r"'alpha' \(fake-alpha 1.0\) is left out by VLLM_PLUGINS='beta'"):
        _resolve(platforms)


def test_the_override_serves_a_backend_with_the_registry_platform(ar_vllm, platforms, monkeypatch):
    monkeypatch.setenv("ACCELREG_VLLM_PLATFORM", "registry")
    _fakes.register(_fakes.backend("acme", 95, "nosuch"))
    assert _resolve(platforms) == "accelreg.integrations.vllm.platform.platform"
    assert "ACCELREG_VLLM_PLATFORM=registry" in ar_vllm.choice().why


def test_vllm_target_device_cpu_keeps_its_meaning(ar_vllm, platforms, monkeypatch):
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    _fakes.register(_fakes.backend("acme", 95))
    assert _resolve(platforms) == "vllm.platforms.cpu.CpuPlatform"
    assert ar_vllm.choice().why.startswith("VLLM_TARGET_DEVICE=cpu")


def test_the_backend_mask_reaches_the_platforms_device_control_variable(
    ar_vllm, plugins, platforms, monkeypatch
):
    plugins("alpha")
    monkeypatch.setenv("ALPHA_DEVICES", "1")
    monkeypatch.delenv("ALPHA_VISIBLE", raising=False)
    accelreg.reset()
    _fakes.register(_fakes.backend("alpha", 90, "alpha", var="ALPHA_DEVICES"))
    assert _resolve(platforms) == "fakeplugin_alpha.AlphaPlatform"
    assert os.environ["ALPHA_VISIBLE"] == "1"  # AlphaPlatform.device_control_env_var


def test_a_mask_that_disagrees_with_the_platforms_variable_is_an_error(
    ar_vllm, plugins, platforms, monkeypatch
):
    plugins("alpha")
    monkeypatch.setenv("ALPHA_DEVICES", "1")
    monkeypatch.setenv("ALPHA_VISIBLE", "0")
    accelreg.reset()
    _fakes.register(_fakes.backend("alpha", 90, "alpha", var="ALPHA_DEVICES"))
    with pytest.raises(
        DeviceError,
        match="ALPHA_DEVICES='1' masks alpha, but vLLM's platform 'alpha' reads ALPHA_VISIBLE='0'",
    ):
        _resolve(platforms)


def test_enable_arms_the_processes_vllm_spawns_and_disable_restores(ar_vllm):
    assert os.environ["ACCELREG_AUTO_INSTALL"] == "1"
    ar_vllm.disable()
    assert "ACCELREG_AUTO_INSTALL" not in os.environ
    assert ar_vllm.choice() is None


def test_conformance_check_of_a_declared_platform(ar_vllm, plugins, platforms):
    plugins("alpha", "badclass")
    _fakes.register(
        _fakes.backend("alpha", 90, "alpha"),
        _fakes.backend("bad", 80, "badclass"),
        _fakes.backend("gone", 70, "nosuch"),
    )
    assert ar_vllm.check_declared("alpha") == ([], [])
    problems, missing = ar_vllm.check_declared("bad")
    assert len(problems) == 1 and "does not import" in problems[0] and missing == []
    problems, missing = ar_vllm.check_declared("gone")
    assert problems == [] and missing == [
        "the vLLM platform 'nosuch' is not installed here (declared by backend 'gone' (plugin 'acme' of <registered>))"
    ]


def test_the_conformance_kit_fails_a_platform_class_that_does_not_import(ar_vllm, plugins, platforms):
    from accelreg.testing import BackendConformance

    plugins("alpha", "badclass")
    _fakes.register(_fakes.backend("alpha", 90, "alpha"), _fakes.backend("bad", 80, "badclass"))

    class Good(BackendConformance):
        backend = "alpha"

    class Bad(BackendConformance):
        backend = "bad"

    Good().test_declared_vllm_platform_loads()
    with pytest.raises(AssertionError, match=r"'fakeplugin_badclass_gone\.GonePlatform' does not import"):
        Bad().test_declared_vllm_platform_loads()


@pytest.mark.slow
def test_accelreg_run_devices_reach_the_registry_platform(tmp_path, emu_built):
    """``accelreg run --devices 1`` on the emulated npu: vLLM's platform is the registry's,
    its device-control variable is the backend's mask, and every answer is the registry's for
    physical device 1 (its own memory size)."""
    code = (
        "import json, os\n"
        "from vllm.platforms import current_platform as p\n"
        "print(json.dumps([type(p).__name__, p.device_type, p.dispatch_key, p.dist_backend,\n"
        "    p.device_control_env_var, os.environ.get(p.device_control_env_var), p.device_count(),\n"
        "    p.get_device_name(0), p.get_device_total_memory(0), p.is_out_of_tree()]))\n"
    )
    env = emu_environ("npu", 2, memory="1GiB,2GiB")
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg", "run", "--devices", "1", "--", sys.executable, "-c", code],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == [
        "RegistryNpuPlatform", "npu", "PrivateUse1", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "1", 1,
        "accelreg-emu NPU 0 (emulated on the host)", 2 << 30, True,
    ]  # fmt: skip
