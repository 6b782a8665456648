"""Entry-point loading through fake ``*.dist-info`` folders, containment and strict mode."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

import accelreg
from accelreg import DeviceError, PluginConflictError, PluginError

from ._fakes import make_dist, plugin, spec

GOOD = """
import accelreg
from accelreg.types import BackendSpec, Availability

@accelreg.hookimpl
def accelreg_backends():
    yield BackendSpec(name={name!r}, priority={priority}, device_type={device_type!r},
                      is_available=lambda: Availability.yes("fake runtime"),
                      device_count=lambda: {count})
"""


def _install(monkeypatch, tmp_path, dist, module, source, ep_name, version="1.2.3"):
    root = make_dist(tmp_path / dist, dist, version, module, source, ep_name)
    monkeypatch.syspath_prepend(str(root))
    accelreg.reset()
    return root


def _good(name="acme", priority=75, device_type="ve", count=2):
    return GOOD.format(name=name, priority=priority, device_type=device_type, count=count)


def test_external_plugin_loads_through_entry_points(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "acme-accel", "fakeplugin_acme", _good(), "acme")
    info = {b.name: b for b in accelreg.backends()}["acme"]
    assert (info.provider, info.provider_version, info.builtin) == ("acme-accel", "1.2.3", False)
    assert info.available and info.device_count == 2
    # priority 75 is below cuda/xpu/npu, but they are unavailable here: acme is current.
    assert accelreg.resolve() == torch.device("ve", 0)
    assert accelreg.resolve("acme:1") == torch.device("ve", 1)


def test_import_error_is_recorded_and_skipped(monkeypatch, tmp_path):
    _install(
        monkeypatch, tmp_path, "broken-dist", "fakeplugin_broken", "raise ImportError('no driver')", "broken"
    )
    with pytest.warns(
        RuntimeWarning, match=r"broken is present .* its import failed: ImportError: no driver"
    ):
        assert accelreg.resolve() == torch.device("cpu")  # loudly: the vendor's plugin is installed
    (failure,) = accelreg.failures()
    assert failure.plugin == "broken" and failure.stage == "import"
    assert (failure.distribution, failure.version) == ("broken-dist", "1.2.3")
    assert "no driver" in failure.error


def test_import_error_raises_in_strict_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    _install(
        monkeypatch, tmp_path, "broken-dist", "fakeplugin_broken2", "raise ImportError('no driver')", "broken"
    )
    with pytest.raises(PluginError, match=r"broken \(from broken-dist 1.2.3\): import failed"):
        accelreg.resolve()


def test_probe_that_raises_makes_only_that_backend_unavailable(monkeypatch, tmp_path):
    source = """
import accelreg
from accelreg.types import BackendSpec

def boom():
    raise OSError("driver exploded")

@accelreg.hookimpl
def accelreg_backends():
    yield BackendSpec(name="acme", priority=200, device_type="ve", is_available=boom, device_count=lambda: 1)
"""
    _install(monkeypatch, tmp_path, "acme-accel", "fakeplugin_boom", source, "acme")
    accelreg.register(plugin(spec("cuda", 1, priority=100)), "fakeplugin_healthy")
    assert accelreg.resolve() == torch.device("cuda", 0)
    info = {b.name: b for b in accelreg.backends()}["acme"]
    assert not info.available and "driver exploded" in info.reason
    assert any("driver exploded" in f.error for f in accelreg.failures())


def test_external_plugin_replaces_builtin(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "vendor-cuda", "fakeplugin_vcuda", _good("cuda", 100, "cuda", 3), "cuda")
    info = {b.name: b for b in accelreg.backends()}["cuda"]
    assert info.provider == "vendor-cuda" and info.replaces and info.replaces.startswith("accelreg")
    assert [b.name for b in accelreg.backends()].count("cuda") == 1
    assert accelreg.resolve(2) == torch.device("cuda", 2)


def test_two_externals_for_one_name_conflict(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "vendor-a", "fakeplugin_va", _good("cuda", 100, "cuda", 1), "cuda")
    _install(monkeypatch, tmp_path, "vendor-b", "fakeplugin_vb", _good("cuda", 100, "cuda", 2), "cuda")
    with pytest.raises(DeviceError, match=r"registered by both vendor-(a|b) 1.2.3 and vendor-(a|b) 1.2.3"):
        accelreg.resolve("cuda:0")
    with pytest.warns(RuntimeWarning, match="registered by both"):
        assert accelreg.resolve() == torch.device("cpu")  # the contested backend is not used silently
    monkeypatch.setenv("ACCELREG_PROVIDERS", "cuda=vendor-b")
    accelreg.reset()
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    assert {b.name: b for b in accelreg.backends()}["cuda"].provider == "vendor-b"


def test_conflict_raises_in_strict_mode(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "vendor-a", "fakeplugin_sa", _good("cuda", 100, "cuda", 1), "cuda")
    _install(monkeypatch, tmp_path, "vendor-b", "fakeplugin_sb", _good("cuda", 100, "cuda", 2), "cuda")
    monkeypatch.setenv("ACCELREG_STRICT", "yes")
    accelreg.reset()
    with pytest.raises(PluginConflictError, match="vendor-a"):
        accelreg.resolve()


def test_autoload_off_never_imports_external_plugins(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "acme-accel", "fakeplugin_never", _good(), "acme")
    monkeypatch.setenv("ACCELREG_DISABLE_PLUGIN_AUTOLOAD", "1")
    accelreg.reset()
    assert accelreg.resolve() == torch.device("cpu")
    assert "fakeplugin_never" not in sys.modules
    assert "acme" not in {b.name for b in accelreg.backends()}
    assert {b.name for b in accelreg.backends()} >= {"cpu", "cuda", "npu"}  # built-ins still load


def test_allowlist(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "acme-accel", "fakeplugin_allowed", _good(), "acme")
    _install(monkeypatch, tmp_path, "other-accel", "fakeplugin_denied", _good("other", 10, "ipu"), "other")
    monkeypatch.setenv("ACCELREG_PLUGINS", "acme")
    accelreg.reset()
    names = {b.name for b in accelreg.backends()}
    assert "acme" in names and "other" not in names
    assert "fakeplugin_denied" not in sys.modules


def test_disable_list_blocks_plugins_and_backends(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, "acme-accel", "fakeplugin_disabled", _good(), "acme")
    monkeypatch.setenv("ACCELREG_DISABLE", "acme,npu")
    accelreg.reset()
    npu = {b.name: b for b in accelreg.backends()}["npu"]
    assert "fakeplugin_disabled" not in sys.modules
    assert not npu.available and "disabled by env ACCELREG_DISABLE" in npu.reason


def test_unknown_hook_is_rejected(monkeypatch, tmp_path):
    source = """
import accelreg

@accelreg.hookimpl
def accelreg_backend():  # typo: no such hook
    return []
"""
    _install(monkeypatch, tmp_path, "typo-dist", "fakeplugin_typo", source, "typo")
    with pytest.warns(RuntimeWarning, match="typo is present"):
        accelreg.resolve()
    (failure,) = accelreg.failures()
    assert failure.stage == "register" and "accelreg_backend" in failure.error


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"available": "yes"}, "is_available returned 'yes'"),
        ({"count": -1}, "device_count returned -1"),
        ({"count": 2.0}, "device_count returned 2.0"),
        ({"count": True}, "device_count returned True"),
    ],
)
def test_nonsense_answers_are_contained(kwargs, match):
    accelreg.register(plugin(spec("cuda", **{"priority": 100, **kwargs})), "fakeplugin_nonsense")
    assert accelreg.resolve() == torch.device("cpu")
    assert any(match in f.error for f in accelreg.failures())
    accelreg.configure(strict=True)  # keeps the registered plugin, drops the answers
    with pytest.raises(PluginError, match=match):
        accelreg.resolve()


def test_hanging_probe_is_cut_off():
    accelreg.configure(probe_timeout=1.0)  # roomy: a loaded machine must not time out the healthy probe
    accelreg.register(
        plugin(spec("cuda", 1, priority=100, available=lambda: time.sleep(30))), "fakeplugin_hang"
    )
    accelreg.register(plugin(spec("xpu", 1, priority=90)), "fakeplugin_ok")
    start = time.perf_counter()
    assert accelreg.resolve() == torch.device("xpu", 0)
    assert time.perf_counter() - start < 5
    cuda = {b.name: b for b in accelreg.backends()}["cuda"]
    assert not cuda.available and "timed out" in cuda.reason


def test_spec_validation():
    bad = [spec("disk", 1), spec("Bad Name", 1), spec("ok", 1, priority=True)]
    accelreg.register(plugin(*bad), "fakeplugin_badspecs")
    accelreg.resolve()
    errors = " | ".join(f.error for f in accelreg.failures())
    assert "reserved" in errors and "not lower case" in errors and "priority" in errors


def test_register_and_unregister():
    name = accelreg.register(plugin(spec("cuda", 1, priority=100)), "fakeplugin_reg")
    assert accelreg.resolve() == torch.device("cuda", 0)
    with pytest.raises(PluginError, match="already registered"):
        accelreg.register(plugin(), name)
    accelreg.unregister(name)
    assert accelreg.resolve() == torch.device("cpu")
    with pytest.raises(PluginError, match="no plugin named"):
        accelreg.unregister(name)


def test_nothing_loads_at_import():
    import subprocess

    code = (
        "import sys, accelreg; "
        "bad = [m for m in ('torch', 'pluggy', 'accelreg.registry', 'accelreg.builtin.cpu') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_accelreg_placement_rules_hook_is_asked_per_backend_and_contained():
    from accelreg import registry
    from accelreg.types import PlacementRule

    asked: list[str] = []

    def rules(backend):
        asked.append(backend)
        if backend == "xpu":
            raise RuntimeError("rule table broken")
        if backend == "hpu":
            return ["not a rule"]
        return [PlacementRule(backend=backend, quant_method="q8", module_classes=("m.Q8",))]

    accelreg.register(plugin(spec("cuda", 1, priority=100), rules=rules), "fakeplugin_rules")
    snap = registry.get()
    assert [r.quant_method for p, r in snap.rules("cuda") if not p.builtin] == ["q8"]
    assert snap.rules("cuda") is snap.rules("cuda")  # cached per snapshot
    assert not [r for p, r in (*snap.rules("xpu"), *snap.rules("hpu")) if not p.builtin]
    assert asked == ["cuda", "xpu", "hpu"]
    assert {f.stage for f in accelreg.failures()} == {"accelreg_placement_rules"}
    assert accelreg.placement_rule("cuda", "q8").module_classes == ("m.Q8",)


def test_a_plugin_for_a_newer_accelreg_loads_when_its_new_hook_is_optional():
    """pluggy's ``optionalhook``: an implementation of a hook this accelreg does not have is
    ignored when marked optional, and the plugin's other hooks work."""
    from accelreg import plugin as surface

    @surface.hookimpl(optionalhook=True)
    def accelreg_backend_versions():  # a hook of some later accelreg
        raise AssertionError("never called: this accelreg has no such hook")

    @surface.hookimpl
    def accelreg_backends():
        yield spec("xpu", 1)

    accelreg.register(
        types.SimpleNamespace(
            accelreg_backends=accelreg_backends, accelreg_backend_versions=accelreg_backend_versions
        ),
        "newer",
    )
    assert accelreg.failures() == []
    assert accelreg.resolve("xpu") == torch.device("xpu", 0)


@pytest.mark.parametrize("marker", [{"hookwrapper": True}, {"wrapper": True}])
def test_hook_wrappers_are_refused_with_the_reason(marker):
    """accelreg calls each plugin's implementation alone and contained, so a wrapper (which
    would be called as a plain implementation) is a failure of that plugin, in words."""
    from accelreg import plugin as surface

    @surface.hookimpl(**marker)
    def accelreg_backends():
        yield spec("xpu", 1)

    accelreg.register(types.SimpleNamespace(accelreg_backends=accelreg_backends), "wrapping")
    with pytest.raises(accelreg.DeviceError):
        accelreg.resolve("xpu")
    (failure,) = accelreg.failures()
    assert failure.plugin == "wrapping" and failure.stage == "register"
    assert "as a hook wrapper" in failure.error and "contained" in failure.error
