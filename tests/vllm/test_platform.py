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
from accelreg.cli import main
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


# -- a platform plugin tied to a backend by its device type (issue 40) ------------------------
def test_platform_plugins_for_different_device_types_each_serve_their_backend(
    ar_vllm, plugins, platforms, monkeypatch
):
    """Two active plugins under entry-point names no backend declares (stock vLLM: "Only one
    platform plugin can be activated"): each serves the backend whose torch device type its
    platform's ``device_type`` is, ahead of the registry platform."""
    plugins("npu_one", "mlu_one", "notype", "alpha")
    _fakes.register(
        _fakes.backend("acme", 95, device_type="npu"), _fakes.backend("other", 90, device_type="mlu")
    )
    assert _resolve(platforms) == "fakeplugin_npu_one_platform.NpuOnePlatform"
    made = ar_vllm.choice()
    assert (made.backend, made.platform) == ("acme", "npu_one")
    assert made.why == (
        "acme is the first available backend by default plugin priorities; backend 'acme' (plugin 'acme' of "
        "<registered>) declares no vLLM platform of its own: the platform plugin 'npu_one' (fake-npu-one 1.0) "
        "serves it, the one active vLLM platform plugin whose device type is 'npu'"
    )
    kinds = {p.name: (p.device_type, p.state) for p in made.plugins}
    assert kinds["npu_one"] == ("npu", "active: fakeplugin_npu_one_platform.NpuOnePlatform")
    assert kinds["mlu_one"] == ("mlu", "active: fakeplugin_mlu_one_platform.MluOnePlatform")
    assert kinds["alpha"] == ("cpu", "active: fakeplugin_alpha.AlphaPlatform")
    assert kinds["notype"] == (None, "active: fakeplugin_notype_platform.NoTypePlatform")
    # the other backend first: the other plugin
    ar_vllm.disable()
    monkeypatch.setenv("ACCELREG_PRIORITY", "other,acme")
    accelreg.reset()
    _fakes.register(
        _fakes.backend("acme", 95, device_type="npu"), _fakes.backend("other", 90, device_type="mlu")
    )
    ar_vllm.enable()
    assert _resolve(platforms) == "fakeplugin_mlu_one_platform.MluOnePlatform"
    assert ar_vllm.choice().platform == "mlu_one"


def test_a_declared_name_not_installed_gives_way_to_a_plugin_of_the_device_type(ar_vllm, plugins, platforms):
    plugins("npu_one")
    _fakes.register(_fakes.backend("acme", 95, ("ascend", "ascend_fork"), device_type="npu"))
    assert _resolve(platforms) == "fakeplugin_npu_one_platform.NpuOnePlatform"
    assert (
        "declares the vLLM platform(s) ascend, ascend_fork, none of them installed here: the platform plugin "
        "'npu_one' (fake-npu-one 1.0) serves it" in ar_vllm.choice().why
    )


def test_a_declared_name_that_is_installed_is_used_and_no_device_type_is_asked(ar_vllm, plugins, platforms):
    """Learning a device type imports the plugin's platform class: done only when the
    backend's declared names are not installed."""
    plugins("alpha", "npu_one")
    _fakes.register(_fakes.backend("acme", 95, "alpha", device_type="npu"))
    assert _resolve(platforms) == "fakeplugin_alpha.AlphaPlatform"
    assert "fakeplugin_npu_one_platform" not in sys.modules
    assert all(p.device_type is None for p in ar_vllm.choice().plugins)


def test_two_platform_plugins_for_one_device_type_are_an_error_naming_both(
    ar_vllm, plugins, platforms, monkeypatch
):
    plugins("npu_one", "npu_two", "mlu_one")
    _fakes.register(_fakes.backend("acme", 95, device_type="npu"))
    with pytest.raises(DeviceError) as info:
        _resolve(platforms)
    assert str(info.value) == (
        "the registry chose acme: backend 'acme' (plugin 'acme' of <registered>) declares no vLLM platform of its "
        "own, and 2 active vLLM platform plugins have its device type 'npu': 'npu_one' (fake-npu-one 1.0: "
        "fakeplugin_npu_one_platform.NpuOnePlatform) and 'npu_two' (fake-npu-two 1.0: "
        "fakeplugin_npu_two_platform.NpuTwoPlatform). accelreg does not pick between them: name the one to use "
        "with ACCELREG_VLLM_PLATFORM=<name>, or leave the others out with VLLM_PLUGINS"
    )
    # either way out that the message names
    for env, want in (
        ({"ACCELREG_VLLM_PLATFORM": "npu_two"}, "fakeplugin_npu_two_platform.NpuTwoPlatform"),
        ({"VLLM_PLUGINS": "npu_one,mlu_one"}, "fakeplugin_npu_one_platform.NpuOnePlatform"),
    ):
        ar_vllm.disable()
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            accelreg.reset()
            _fakes.register(_fakes.backend("acme", 95, device_type="npu"))
            ar_vllm.enable()
            assert _resolve(platforms) == want


def test_a_plugin_whose_platform_declares_no_device_type_serves_nothing(ar_vllm, plugins, platforms):
    plugins("notype")
    _fakes.register(_fakes.backend("acme", 95, device_type="notype"))
    assert _resolve(platforms) == "accelreg.integrations.vllm.platform.platform"
    made = ar_vllm.choice()
    assert made.platform == "registry"
    assert made.why.endswith(
        "declares no vLLM platform of its own: accelreg's registry platform serves it (no active vLLM platform "
        "plugin has device type 'notype' (notype: declares no device type))"
    )


def test_the_registry_platform_is_the_last_resort(ar_vllm, plugins, platforms):
    """No plugin of the backend's device type (others active, one inactive, one failing to
    load): the registry platform, each plugin named in why."""
    plugins("mlu_one", "sleepy", "alpha", "broken")
    _fakes.register(_fakes.backend("acme", 95, device_type="npu"))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert _resolve(platforms) == "accelreg.integrations.vllm.platform.platform"
    assert ar_vllm.choice().why.endswith(
        "accelreg's registry platform serves it (no active vLLM platform plugin has device type 'npu' "
        "(alpha: cpu, broken: failed to load, mlu_one: mlu, sleepy: inactive))"
    )


def test_a_declared_name_not_installed_and_no_plugin_of_the_device_type_is_still_an_error(
    ar_vllm, plugins, platforms
):
    plugins("mlu_one")
    _fakes.register(_fakes.backend("acme", 95, "ascend", device_type="npu"), name="acme-plugin")
    with pytest.raises(DeviceError) as info:
        _resolve(platforms)
    message = str(info.value)
    assert "declares the vLLM platform 'ascend', which is neither one of vLLM's own" in message
    assert (
        "(entry points vllm.platform_plugins: mlu_one (fake-mlu-one 1.0)), and no active vLLM platform "
        in message
    )
    assert "plugin has device type 'npu' (mlu_one: mlu); install the plugin, or set" in message


def test_a_platform_class_that_does_not_import_while_asking_device_types_is_recorded(
    ar_vllm, plugins, platforms
):
    """It may be the platform of this very device: a recorded failure and a warning, and the
    registry platform still serves the backend on its own device."""
    plugins("badclass")
    _fakes.register(_fakes.backend("acme", 95, device_type="npu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _resolve(platforms) == "accelreg.integrations.vllm.platform.platform"
    f = next(f for f in registry.get().failures if f.plugin == "badclass")
    assert (f.distribution, f.stage) == ("fake-badclass", "vLLM platform plugin activation")
    assert "fakeplugin_badclass_gone" in f.error
    assert any(
        "vLLM platform plugin 'badclass' failed: its platform class 'fakeplugin_badclass_gone.GonePlatform' does "
        "not import" in str(w.message)
        for w in caught
    )


def test_env_without_activation_imports_no_plugin_and_says_what_is_unknown(plugins, capsys):
    """``accelreg env`` reads the entry points only: a backend a plugin could serve by device
    type is "not known", and the report says how to learn it."""
    plugins("npu_one", "mlu_one")
    _fakes.register(_fakes.backend("acme", 95, device_type="npu"))
    before = set(sys.modules)
    assert main(["env", "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["vllm"]
    assert not {m for m in set(sys.modules) - before if m.startswith("fakeplugin")}
    assert section["activated"] is False
    assert {p["name"]: (p["state"], p["device_type"]) for p in section["plugins"]}["npu_one"] == (
        "installed",
        None,
    )
    assert section["platform"]["platform"] is None
    assert section["platform"]["why"].endswith(
        "declares no vLLM platform of its own: the one active platform plugin whose device type is 'npu' serves "
        "it, else accelreg's registry platform; the device types of mlu_one, npu_one are known only once each is "
        "activated, which runs its code (accelreg env --vllm-activate)"
    )
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert "  platform: not known without activating the platform plugins for backend acme" in text
    assert (
        "  plugin npu_one (fake-npu-one 1.0, fakeplugin_npu_one:activate): installed; device type not asked "
        in text
    )


def test_env_vllm_activate_lists_device_types_and_what_serves_each_backend(plugins, capsys):
    from tests.test_schemas import check

    plugins("npu_one", "npu_two", "mlu_one", "notype")
    _fakes.register(
        _fakes.backend("acme", 95, device_type="npu"),
        _fakes.backend("other", 90, device_type="mlu"),
        _fakes.backend("third", 85, "alpha_gone", device_type="sdaa"),
    )
    assert main(["env", "--vllm-activate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check("env", data)
    section = data["vllm"]
    assert section["activated"] is True and section["scope"].endswith("--vllm-activate)")
    kinds = {p["name"]: p["device_type"] for p in section["plugins"]}
    assert {k: kinds[k] for k in ("npu_one", "npu_two", "mlu_one", "notype")} == {
        "npu_one": "npu",
        "npu_two": "npu",
        "mlu_one": "mlu",
        "notype": None,
    }
    rows = {r["backend"]: r for r in section["backends"]}
    assert rows["other"]["platform"] == "mlu_one" and rows["other"]["error"] is None
    assert rows["other"]["class"] == "fakeplugin_mlu_one_platform.MluOnePlatform"
    assert rows["acme"]["platform"] is None and "'npu_one' (fake-npu-one 1.0" in rows["acme"]["error"]
    assert "'npu_two' (fake-npu-two 1.0" in rows["acme"]["error"]
    assert rows["third"]["error"].startswith(
        "backend 'third' (plugin 'acme' of <registered>) declares the vLLM"
    )
    assert rows["cpu"]["platform"] == "cpu"
    assert section["platform"] is None and "accelreg does not pick between them" in section["error"]
    assert main(["env", "--vllm-activate"]) == 0
    text = capsys.readouterr().out
    assert "    other (device type mlu): mlu_one (fakeplugin_mlu_one_platform.MluOnePlatform)" in text
    assert "  plugin mlu_one (fake-mlu-one 1.0, fakeplugin_mlu_one:activate): active: " in text
    assert "MluOnePlatform; device type mlu" in text


#: What ``current_platform`` is in a process under ``accelreg run``.
_PLATFORM_CODE = (
    "import json\n"
    "from vllm.platforms import current_platform as p\n"
    "print(json.dumps([type(p).__name__, p.device_type]))\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "installed", "want"),
    [
        ("npu", ("npu_one", "mlu_one", "notype", "alpha"), ["NpuOnePlatform", "npu"]),
        ("mlu", ("npu_one", "mlu_one", "notype", "alpha"), ["MluOnePlatform", "mlu"]),
        ("mlu", ("npu_one", "notype"), ["RegistryMluPlatform", "mlu"]),  # the last resort
    ],
)
def test_accelreg_run_on_the_emulator_takes_the_plugin_of_its_device_type(
    tmp_path, emu_built, name, installed, want
):
    """``accelreg run`` on the emulated npu or mlu (their backends declare no vLLM platform)
    with platform plugins installed under names no backend declares: vLLM runs on the one
    whose device type is the emulated device's, else on the registry platform."""
    folders = _fakes.install(tmp_path / "plugins", *installed)
    path = os.pathsep.join([*map(str, folders), os.environ.get("PYTHONPATH", "")])
    env = emu_environ(name, 1, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg", "run", "--", sys.executable, "-c", _PLATFORM_CODE],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want


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
