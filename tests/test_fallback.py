"""Never silently on the wrong device: a present accelerator that fails is loud.

"Present" means its runtime package is installed, its visible-devices variable lists devices,
or configuration (``providers``; ``priority`` from an argument or variable) names it. Passing
over such a backend warns once; under a launcher ``resolve()`` raises instead of answering
``cpu`` unless ``cpu_fallback`` is set; strict mode always raises. A backend that is merely
absent (nothing of it here) stays silent, so CPU-only torchrun jobs keep resolving to ``cpu``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import accelreg
from accelreg import ConfigError, DeviceError

from ._fakes import plugin, spec

PRESENT = "json"  # installed everywhere: stands in for a vendor runtime package
LAUNCHERS = ["LOCAL_RANK", "RANK", "WORLD_SIZE"]


def _failing(name: str = "cuda", *, package: str | None = PRESENT, priority: int = 100, **kw):
    return spec(name, 2, priority=priority, available=False, runtime_package=package, **kw)


@pytest.fixture
def quiet():
    """Fail on any accelreg warning: the block must stay silent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelreg: ", category=RuntimeWarning)
        yield


def test_present_but_failing_warns_once_naming_backend_reason_and_how_to_silence():
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.warns(RuntimeWarning) as record:
        assert accelreg.resolve() == torch.device("cpu")
    (message,) = [str(w.message) for w in record]
    assert "cuda is present (json is installed) but unavailable: scripted" in message
    assert "ACCELREG_DISABLE=cuda" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accelreg.resolve() == torch.device("cpu")  # once per process
        assert accelreg.resolve("auto") == torch.device("cpu")
        assert accelreg.current_backend().name == "cpu"


def test_current_backend_warns_too():
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.warns(RuntimeWarning, match="cuda is present"):
        assert accelreg.current_backend().name == "cpu"


@pytest.mark.parametrize("var", LAUNCHERS)
def test_under_a_launcher_resolve_raises_instead_of_answering_cpu(var, monkeypatch):
    monkeypatch.setenv(var, "0")
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    for spec_ in (None, "auto"):
        with pytest.raises(
            DeviceError, match=rf"cuda is present .* launcher \({var}=0\).*ACCELREG_CPU_FALLBACK=1"
        ):
            accelreg.resolve(spec_)
    assert accelreg.resolve("cpu") == torch.device("cpu")  # asking for the cpu is never refused


@pytest.mark.parametrize("source", ["argument", "env", "file"])
def test_cpu_fallback_is_an_explicit_opt_in(source, monkeypatch, tmp_path):
    monkeypatch.setenv("LOCAL_RANK", "0")
    if source == "env":
        monkeypatch.setenv("ACCELREG_CPU_FALLBACK", "1")
    elif source == "file":
        (tmp_path / "work" / "accelreg.toml").write_text("cpu_fallback = true\n")
    accelreg.reset()
    if source == "argument":
        accelreg.configure(cpu_fallback=True)
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.warns(RuntimeWarning, match="cuda is present"):
        assert accelreg.resolve() == torch.device("cpu")


def test_strict_mode_raises_even_without_a_launcher(monkeypatch):
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    monkeypatch.setenv("ACCELREG_CPU_FALLBACK", "1")
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.raises(DeviceError, match="ACCELREG_STRICT"):
        accelreg.resolve()
    with pytest.raises(DeviceError, match="ACCELREG_STRICT"):
        accelreg.current_backend()


def test_passing_over_to_another_accelerator_warns_but_a_launcher_job_proceeds(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.register(plugin(_failing(), spec("xpu", 2, priority=90)), "fakeplugin_two")
    with pytest.warns(RuntimeWarning, match="cuda is present.*using xpu instead"):
        assert accelreg.resolve() == torch.device("xpu", 1)


def test_absent_backends_stay_silent_so_cpu_only_launcher_jobs_run(quiet, monkeypatch):
    for var in LAUNCHERS:
        monkeypatch.setenv(var, "0")
    accelreg.register(plugin(_failing(package="fakeplugin_no_such_runtime")), "fakeplugin_absent")
    assert accelreg.resolve() == torch.device("cpu")  # every built-in is absent here too
    assert accelreg.current_backend().name == "cpu"


def test_disabling_the_backend_silences_it(quiet, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("ACCELREG_DISABLE", "cuda")
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    assert accelreg.resolve() == torch.device("cpu")


@pytest.mark.parametrize(
    ("value", "present"), [("0", True), ("0,abc", True), ("", False), ("NoDevFiles", False)]
)
def test_a_visible_devices_variable_that_lists_devices_makes_a_builtin_present(value, present, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", value)
    monkeypatch.setenv("LOCAL_RANK", "0")
    if present:
        with pytest.raises(DeviceError, match=r"npu is present \(ASCEND_RT_VISIBLE_DEVICES=.* is set\)"):
            accelreg.resolve()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert accelreg.resolve() == torch.device("cpu")  # "" and NoDevFiles hide every device


def test_configuration_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELREG_PRIORITY", "npu")
    with pytest.warns(
        RuntimeWarning, match=r"npu is present \(priority \(env ACCELREG_PRIORITY\) names it\)"
    ):
        accelreg.resolve()
    # a priority list in a file is a preference shared by many machines, not a claim
    monkeypatch.delenv("ACCELREG_PRIORITY")
    (tmp_path / "work" / "accelreg.toml").write_text("priority = ['npu', 'cuda']\n")
    accelreg.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accelreg.resolve() == torch.device("cpu")


def test_int_without_an_accelerator_names_the_present_one():
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.raises(DeviceError, match=r"no accelerator is available .* \(cuda is present"):
        accelreg.resolve(0)


def test_an_installed_plugin_that_failed_to_load_is_present(monkeypatch, tmp_path):
    from ._fakes import make_dist

    root = make_dist(
        tmp_path / "d", "acme-accel", "1.0", "fakeplugin_acme_broken", "raise OSError('no driver')", "acme"
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("WORLD_SIZE", "2")
    accelreg.reset()
    with pytest.raises(
        DeviceError, match=r"acme is present \(plugin 'acme' of acme-accel 1.0 is installed\)"
    ):
        accelreg.resolve()


# -- providers ------------------------------------------------------------------------------
def test_providers_naming_an_uninstalled_distribution_warns_and_keeps_the_builtin(monkeypatch):
    monkeypatch.setenv("ACCELREG_PROVIDERS", "npu=acme-npu")
    with pytest.warns(RuntimeWarning, match="no distribution 'acme-npu' is installed; that entry is ignored"):
        npu = {b.name: b for b in accelreg.backends()}["npu"]
    assert npu.provider == "accelreg" and npu.reason == "torch_npu is not installed"  # not blocked
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    accelreg.reset()
    with pytest.raises(ConfigError, match="acme-npu"):
        accelreg.backends()


def test_duplicate_providers_entries_are_refused(monkeypatch):
    monkeypatch.setenv("ACCELREG_PROVIDERS", "npu=acme-npu,npu=other-npu")
    with pytest.raises(ConfigError, match="'npu' is listed twice"):
        accelreg.resolve()


def test_documented_sample_changes_nothing_on_this_machine(tmp_path, quiet):
    """The accelreg.toml sample of docs/configuration.md, copied as is."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    sample = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    before = [(b.name, b.available, b.reason) for b in accelreg.backends()]
    (tmp_path / "work" / "accelreg.toml").write_text(sample)
    accelreg.reset()
    after = {b.name: (b.name, b.available, b.reason) for b in accelreg.backends()}
    assert accelreg.resolve() == torch.device("cpu")
    assert [after[name] for name, _, _ in before if name != "mlu"] == [b for b in before if b[0] != "mlu"]


def _device_decisions():
    """Every public answer that picks the current backend for a device decision, beside
    ``resolve()``: each follows the same rule."""
    from accelreg.integrations.peft.device import infer_device as _infer_device
    from accelreg.planner import default_max_memory

    return {
        "device_count()": accelreg.device_count,
        "dist_backend()": accelreg.dist_backend,
        "default_max_memory()": default_max_memory,
        "visible_devices_env()": lambda: accelreg.visible_devices_env(None, [0]),
        "peft infer_device()": _infer_device(lambda: "cuda"),
    }


@pytest.mark.parametrize("what", sorted(_device_decisions()))
def test_every_device_decision_refuses_the_silent_cpu_under_a_launcher(what, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.raises(DeviceError, match=r"cuda is present .* launcher \(RANK=0\)"):
        _device_decisions()[what]()


@pytest.mark.parametrize("what", sorted(_device_decisions()))
def test_every_device_decision_warns_outside_a_launcher(what):
    accelreg.register(plugin(_failing()), "fakeplugin_failing")
    with pytest.warns(RuntimeWarning, match="cuda is present"):
        try:
            _device_decisions()[what]()
        except DeviceError as exc:  # cpu has no mask: visible_devices_env says so, after warning
            assert "no visible-devices variable" in str(exc)


def test_a_presence_probe_makes_a_runtime_shipped_with_torch_loud(monkeypatch):
    """cuda ships with torch (no runtime package): its plugin's ``presence`` probe says when the
    machine has the hardware anyway (a loaded driver), so a CPU build of torch or a broken driver
    on a GPU node is never a silent cpu."""
    found = spec("cuda", 2, priority=100, available=False, presence=lambda: "the GPU driver is loaded")
    accelreg.register(plugin(found), "fakeplugin_failing")
    with pytest.warns(RuntimeWarning, match=r"cuda is present \(the GPU driver is loaded\)"):
        assert accelreg.resolve() == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "0")
    accelreg.reset()
    accelreg.register(plugin(found), "fakeplugin_failing")
    with pytest.raises(DeviceError, match="the GPU driver is loaded"):
        accelreg.resolve()


@pytest.mark.parametrize("answer", ["raise", "nonsense"])
def test_a_failing_presence_probe_is_contained_and_recorded(answer, quiet):
    def presence():
        if answer == "raise":
            raise RuntimeError("cannot read /proc")
        return 42

    accelreg.register(
        plugin(spec("cuda", 2, priority=100, available=False, presence=presence)), "fakeplugin_p"
    )
    assert accelreg.resolve() == torch.device("cpu")  # not present: silent
    (failure,) = accelreg.failures()
    assert failure.stage == "probe presence of 'cuda'"
    assert ("cannot read /proc" if answer == "raise" else "presence returned 42") in failure.error


def test_builtin_cuda_is_present_where_a_gpu_driver_is_loaded(monkeypatch, tmp_path):
    """The real built-in: torch here is a CPU build, so cuda is unavailable; with a (stand-in)
    NVIDIA driver file on the machine, passing over it warns and a launcher refuses."""
    from accelreg.builtin import cuda

    driver = tmp_path / "version"
    driver.write_text("NVRM version: 580.00\n")
    monkeypatch.setattr(cuda, "DRIVER_FILES", ((str(driver), "the NVIDIA kernel driver is loaded"),))
    accelreg.reset()
    with pytest.warns(
        RuntimeWarning, match=r"cuda is present \(the NVIDIA kernel driver is loaded .*version\)"
    ):
        assert accelreg.resolve() == torch.device("cpu")
    monkeypatch.setattr(
        cuda, "DRIVER_FILES", ((str(tmp_path / "absent"), "the NVIDIA kernel driver is loaded"),)
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    accelreg.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accelreg.resolve() == torch.device("cpu")  # no driver: a CPU machine, silent
