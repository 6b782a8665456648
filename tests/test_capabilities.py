"""``accelreg.capabilities()``: what a device computes in (issue 36, part 2).

A backend's plugin declares it or probes it (``BackendSpec.dtypes``); what the plugin leaves out
is asked of the runtime's device module (``torch.<device_type>.is_bf16_supported()``,
``.get_amp_supported_dtype()``); where neither says, the answer is unknown, never ``False``.
Fake backends use device types torch knows without a runtime (``ve``: torch has no ``torch.ve``,
so a test gives it one); the built-in cuda, xpu and mps answer here through stand-ins for their
runtimes (none can exist on this machine). The emulator's answers, under every name, and the
built-in npu, mlu, musa, sdaa and hpu against the emulated runtimes: tests/emu/test_capabilities_emu.py.
"""

from __future__ import annotations

import json
import types

import pytest
import torch

import accelreg
from accelreg import registry
from accelreg.cli import main
from accelreg.cli.env import env_report, markdown_report
from accelreg.dtypes import COMPUTE_DTYPES, dtype_name, try_dtypes
from accelreg.types import BackendSpec, Capabilities, DtypeSupport

from ._fakes import plugin, spec
from .test_schemas import check


def _register(name: str = "fakeplugin_caps", **extra: object) -> None:
    accelreg.register(plugin(spec("ve", 2, priority=100, **extra)), name)


def _answers(caps: Capabilities) -> dict[str, tuple[bool | None, str]]:
    return {d.dtype: (d.supported, d.source) for d in caps.dtypes}


# -- the plugin declares -------------------------------------------------------------------------
def test_a_declared_mapping_answers_with_its_reasons():
    _register(dtypes={"bfloat16": True, torch.float16: (False, "no fp16 units"), "float8_e4m3fnuz": True})
    caps = accelreg.capabilities()
    assert (caps.backend, caps.device) == ("ve", "ve:0")
    assert [d.dtype for d in caps.dtypes] == [*COMPUTE_DTYPES, "float8_e4m3fnuz"]
    assert caps.supports(torch.bfloat16) is True and caps.support("bf16").source == "declared"
    assert "declared by ve's plugin (fakeplugin_caps)" == caps.support("bfloat16").reason
    assert caps.support("fp16") == DtypeSupport("float16", False, "declared", "no fp16 units")
    assert caps.supports("float8_e4m3fnuz") is True  # a dtype of this hardware's own, declared


def test_what_nobody_says_is_unknown_never_false():
    """No declaration and no ``torch.ve``: every answer is unknown, says who was asked, and is
    ``None`` — a caller that reads it as ``False`` is wrong, not told ``False``."""
    _register()
    caps = accelreg.capabilities("ve:1")
    assert caps.device == "ve:1"
    for d in caps.dtypes:
        assert d.supported is None and not d.known and d.source == "unknown", d
        assert "ve's plugin (fakeplugin_caps) declares nothing about" in d.reason, d
    assert (
        "torch.ve has no is_bf16_supported() or get_amp_supported_dtype()" in caps.support("bfloat16").reason
    )
    assert "torch asks runtimes nothing about float8_e5m2" in caps.support("float8_e5m2").reason
    assert caps.supports("bf16") is None


def test_a_probe_answers_per_device_once_per_build():
    calls: list[int] = []

    def dtypes(index: int) -> dict[str, object]:
        calls.append(index)
        fp8 = index == 0
        return {"bfloat16": True, "float16": None, "float8_e4m3fn": (fp8, f"device {index} says so")}

    _register(dtypes=dtypes)
    torch_ve = types.SimpleNamespace(get_amp_supported_dtype=lambda: [torch.float16])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "ve", torch_ve, raising=False)
        first, second = accelreg.capabilities(0), accelreg.capabilities("ve:1")
        assert accelreg.capabilities(torch.device("ve", 0)) == first  # kept, not asked again
    assert calls == [0, 1]
    assert _answers(first)["float8_e4m3fn"] == (True, "probe")
    assert second.support("float8_e4m3fn").reason == "device 1 says so"
    assert second.supports("float8_e4m3fn") is False
    # None is "not saying": the runtime answers float16
    assert _answers(first)["float16"] == (True, "runtime")
    assert first.support("float16").reason == "torch.ve.get_amp_supported_dtype() lists torch.float16"
    assert first.support("bfloat16").reason == "answered by the dtypes probe of ve's plugin (fakeplugin_caps)"


# -- the runtime answers what the plugin does not ------------------------------------------------
@pytest.mark.parametrize("bf16", [True, False])
def test_a_plugin_that_declares_nothing_is_asked_through_its_device_module(monkeypatch, bf16):
    module = types.SimpleNamespace(
        is_bf16_supported=lambda: bf16, get_amp_supported_dtype=lambda: [torch.float16, torch.bfloat16]
    )
    monkeypatch.setattr(torch, "ve", module, raising=False)
    _register()
    caps = accelreg.capabilities()
    assert caps.support("bfloat16") == DtypeSupport(
        "bfloat16", bf16, "runtime", f"torch.ve.is_bf16_supported() answered {bf16}"
    )  # the runtime's own False stands: get_amp_supported_dtype() does not overrule it
    assert _answers(caps)["float16"] == (True, "runtime")
    assert caps.supports("float8_e4m3fn") is None


def test_failures_are_contained_and_say_why(monkeypatch):
    def broken(index: int) -> dict[str, object]:
        raise RuntimeError("driver gone")

    _register(dtypes=broken)
    caps = accelreg.capabilities()
    assert all(d.supported is None and d.source == "unknown" for d in caps.dtypes), caps
    assert caps.support("bf16").reason == (
        "unknown, because the dtypes probe of ve's plugin (fakeplugin_caps) failed: RuntimeError: driver gone"
    )
    assert [f.stage for f in accelreg.failures()] == ["probe dtypes of 've'"]
    assert accelreg.resolve() == torch.device("ve", 0)  # the backend itself is fine

    accelreg.reset()
    _register("fakeplugin_caps_nonsense", dtypes=lambda index: {"bfloat16": 1})
    reason = accelreg.capabilities().support("bfloat16").reason
    assert "answered nonsense" in reason and "dtypes['bfloat16'] is 1, not True, False or None" in reason

    accelreg.reset()

    def is_bf16_supported() -> bool:
        raise RuntimeError("no context")

    monkeypatch.setattr(
        torch, "ve", types.SimpleNamespace(is_bf16_supported=is_bf16_supported), raising=False
    )
    _register("fakeplugin_caps_runtime")
    answer = accelreg.capabilities().support("bfloat16")
    assert (
        answer.supported is None
        and "torch.ve.is_bf16_supported() failed: RuntimeError: no context" in answer.reason
    )
    assert [f.stage for f in accelreg.failures()] == ["probe torch.ve.is_bf16_supported of 've'"]


@pytest.mark.parametrize(
    ("dtypes", "problem"),
    [
        ({"bfloat16": "yes"}, "dtypes['bfloat16'] is 'yes', not True, False or None"),
        ({"bf16": True, "bfloat16": False}, "dtypes names bfloat16 twice"),
        ({"bfloat 16": True}, "is not a dtype name"),
        ({3: True}, "a dtype is a torch.dtype or its name"),
        ({"bfloat16": (True, "")}, "not a non-empty str"),
        ({f"x{i}": True for i in range(33)}, "at most 32"),
        (42, "neither a mapping nor a probe"),
    ],
)
def test_a_malformed_declaration_fails_the_plugin_alone(dtypes, problem):
    _register("fakeplugin_caps_bad", dtypes=dtypes)
    assert "ve" not in {b.name for b in accelreg.backends()}
    (failure,) = accelreg.failures()
    assert failure.stage == "accelreg_backends" and problem in failure.error, failure
    assert accelreg.capabilities().device == "cpu"  # the others answer


# -- the query ----------------------------------------------------------------------------------
def test_the_query_reads_its_argument_as_resolve_does():
    caps = accelreg.capabilities()  # no accelerator here: the cpu
    assert (caps.backend, caps.device) == ("cpu", "cpu") and caps == accelreg.capabilities("cpu")
    with pytest.raises(accelreg.DeviceError, match="no accelerator is available"):
        accelreg.capabilities(0)
    with pytest.raises(accelreg.DeviceError, match=r"meta device .* computes nothing"):
        accelreg.capabilities("meta")
    with pytest.raises(accelreg.DeviceError, match="no backend is called 'acme'"):
        accelreg.capabilities("acme:0")
    with pytest.raises(TypeError):
        accelreg.capabilities(True)
    with pytest.raises(accelreg.DeviceError, match="not 'float32'"):
        caps.support(torch.float32)
    with pytest.raises(accelreg.DeviceError, match="is not a dtype name"):
        caps.support("bfloat 16")
    with pytest.raises(TypeError):
        caps.supports(16)
    _register()
    assert accelreg.capabilities(1, backend="ve").device == "ve:1"
    assert accelreg.capabilities(backend="cpu").backend == "cpu"


def test_the_cpu_computes_in_all_four_in_this_torch():
    """torch 2.13's CPU kernels run bf16 and fp16 (matmul, layer norm) and a scaled matmul on
    both float8 formats; the cpu backend answers by trying, so an older torch would say no."""
    caps = accelreg.capabilities("cpu")
    assert _answers(caps) == {name: (True, "probe") for name in COMPUTE_DTYPES}
    assert (
        caps.support("float8_e5m2").reason == "a scaled matrix multiply (torch._scaled_mm) on float8_e5m2 ran"
    )


def test_try_dtypes_says_what_did_not_run(monkeypatch):
    monkeypatch.delattr(torch, "_scaled_mm")
    tried = try_dtypes("cpu")
    assert tried["bfloat16"][0] is True
    assert tried["float8_e4m3fn"] == (False, f"torch {torch.__version__} has no torch._scaled_mm")


def test_dtype_names():
    assert [dtype_name(d) for d in (torch.bfloat16, "bf16", "FP16", "torch.float8_e5m2", "half")] == [
        "bfloat16",
        "bfloat16",
        "float16",
        "float8_e5m2",
        "float16",
    ]


# -- the built-ins answer from their runtimes (stand-ins: no CUDA, XPU or Metal here) ------------
def _cuda(monkeypatch, capabilities: dict[int, tuple[int, int]], hip: str | None = None):
    from accelreg.builtin import cuda

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: types.SimpleNamespace(major=capabilities[index][0], minor=capabilities[index][1]),
    )
    return cuda


def test_builtin_cuda_answers_per_device_by_compute_capability(monkeypatch):
    cuda = _cuda(monkeypatch, {0: (9, 0), 1: (8, 0), 2: (7, 0)})
    runtime = BackendSpec(
        name="cuda", priority=100, is_available=lambda: True, device_count=lambda: 3, dtypes=cuda._dtypes
    )
    accelreg.register(plugin(runtime), "fakeplugin_cuda_runtime")
    hopper, ampere, volta = (accelreg.capabilities(f"cuda:{i}") for i in range(3))
    assert {d.dtype: d.supported for d in hopper.dtypes} == dict.fromkeys(COMPUTE_DTYPES, True)
    assert ampere.supports("bf16") is True and ampere.supports("float8_e4m3fn") is False
    assert ampere.support("float8_e5m2").reason == (
        "compute capability 8.0 < 8.9 (float8 matrix multiplies need Ada or Hopper)"
    )
    # torch.cuda.is_bf16_supported() counts emulation on older devices by making a bf16 tensor;
    # on this CPU build of torch that fails, so the answer is False, and says why
    bf16 = volta.support("bfloat16")
    assert bf16.supported is False and bf16.reason.startswith(
        "compute capability 7.0 < 8.0, and no bfloat16 tensor"
    )
    assert volta.supports("fp16") is True


def test_builtin_cuda_on_rocm_leaves_float8_unanswered(monkeypatch):
    cuda = _cuda(monkeypatch, {0: (9, 4)}, hip="6.2.41133")
    answers = cuda._dtypes(0)
    assert answers["bfloat16"][0] is True and answers["float16"][0] is True
    assert "float8_e4m3fn" not in answers  # unknown through the registry, not False


def test_builtin_xpu_and_mps_answer_from_their_runtimes(monkeypatch):
    from accelreg.builtin import mps, xpu

    monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(
        torch.xpu, "get_device_properties", lambda index: types.SimpleNamespace(has_fp16=index == 0)
    )
    assert xpu._dtypes(0) == {
        "bfloat16": (True, "torch.xpu.is_bf16_supported() answered True"),
        "float16": (True, "torch.xpu.get_device_properties(0).has_fp16 is True"),
    }
    assert xpu._dtypes(1)["float16"][0] is False
    for macos14, bf16 in ((True, True), (False, False)):
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor, ok=macos14: ok)
        answers = mps._dtypes(0)
        assert answers["bfloat16"][0] is bf16 and answers["float16"][0] is True


# -- accelreg env ---------------------------------------------------------------------------------
def test_env_shows_each_devices_answers(capsys):
    _register(dtypes={"bfloat16": True, "float16": (False, "no fp16 units")})
    report = env_report()
    check("env", json.loads(json.dumps(report)))
    ve = next(b for b in report["backends"] if b["name"] == "ve")
    assert [c["device"] for c in ve["capabilities"]] == ["ve:0", "ve:1"]
    assert ve["capabilities"][0]["dtypes"]["float16"] == {
        "supported": False,
        "source": "declared",
        "reason": "no fp16 units",
    }
    cpu = next(b for b in report["backends"] if b["name"] == "cpu")
    assert [c["device"] for c in cpu["capabilities"]] == ["cpu"]
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert (
        "compute dtypes (accelreg.capabilities(); unknown: neither the plugin nor the runtime says):" in text
    )
    rows = [line.split() for line in text.splitlines() if line.startswith(("ve:", "cpu "))]
    assert ["ve:0", "yes", "no", "unknown", "unknown"] in rows and ["cpu", "yes", "yes", "yes", "yes"] in rows
    assert "  ve float16: no fp16 units" in text  # each answer other than yes says why, once
    assert text.count("ve float8_e4m3fn: unknown") == 1
    md = markdown_report(report)
    assert "**Compute dtypes** (`accelreg.capabilities()`)" in md
    assert "| ve:0 | yes | no | unknown | unknown |" in md


def test_an_unavailable_backend_answers_nothing():
    _register(available=False, dtypes=lambda index: {"bfloat16": True})
    ve = registry.get().backend("ve")
    from accelreg.registry.capabilities import capabilities

    caps = capabilities(ve, 0, "ve:0")  # not reachable through the query: resolve() refuses
    assert {d.supported for d in caps.dtypes} == {None}
    assert caps.support("bfloat16").reason == "unknown, because ve is unavailable: scripted"
    assert next(b for b in env_report()["backends"] if b["name"] == "ve")["capabilities"] == []
