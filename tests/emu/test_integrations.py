"""``accelreg.install()`` end to end on the emulated accelerator: transformers, accelerate and
peft ask the registry, and nothing asks CUDA.

Two groups, each one child process per emulated backend (the ``accelreg_emu`` marker;
PrivateUse1 can be renamed once per process):

* :class:`TestSeed002` — seed 002 under ``npu``, ``mlu`` and ``musa`` impersonation (2 devices):
  first the canaries that name the upstream path that still asks ``torch.cuda`` without
  accelreg, then with ``install()``: a tiny Qwen2 loads with ``device_map="auto"``, ``{"": 0}``,
  ``{"": 1}`` and ``"<backend>"``, generates, matches the CPU logits, and not one ``torch.cuda``
  function is called; ``device_map="cuda"`` is refused (never remapped).
* :class:`TestModels` — under ``npu`` with 4 small devices: seed 001 (GPT-2's tied
  ``wte``/``lm_head`` planned as one unit across a forced split), bitsandbytes 8-bit and 4-bit
  with ``device_map="auto"`` (8-bit also on a runtime without the shallow-copy override: refused
  up front), and peft LoRA on a model spread over two devices.

The stages are fixtures: :func:`stock` imports the backend's vendor package and the libraries
and snapshots every module-level attribute of the patched libraries before anything is
installed; each group's fixture (:func:`seed`, :func:`models`) builds its tiny models from that
stock process; ``seed_installed`` / ``models_installed`` (after the group's models) call
``install()``. A test of the stock libraries asks for ``without_install`` (the integrations
are off while it runs, whatever ran before it), one of accelreg for the group's ``*_installed``.
Each group ends with a test that loads through the installed seams, uninstalls, and checks that
every patched attribute is the identical object it was before ``install()``
(:func:`uninstall_restores_every_patched_attribute`; it installs again after, so no test depends
on running before it). The models are random-initialised and saved to a temporary directory;
nothing is downloaded. The upstream canaries without accelreg for seeds 001/002 are in
test_emu_models.py.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.version import Version

import accelreg
import accelreg.integrations
from accelreg.integrations import accelerate as ar_accelerate
from accelreg.integrations import peft as ar_peft
from accelreg.integrations import transformers as ar_transformers

from .._matrix import emu_names

pytestmark = pytest.mark.emu

LIBS = ("transformers", "accelerate", "peft")
INTEGRATIONS = (ar_transformers.INTEGRATION, ar_accelerate.INTEGRATION, ar_peft.INTEGRATION)
CHANGED = "upstream changed: "


# -- the stock process: the vendor package, the libraries, a snapshot taken before install() ----
def _lib_modules() -> dict[str, types.ModuleType]:
    return {n: m for n, m in list(sys.modules.items()) if m is not None and n.split(".")[0] in LIBS}


def _snapshot() -> dict[tuple[Any, str], Any]:
    """(module name, attr) -> object, for every attribute of every module of the libraries,
    and (class, attr) -> the raw class attribute of every class seam."""
    snap: dict[tuple[Any, str], Any] = {}
    for name, module in _lib_modules().items():
        for attr, value in list(vars(module).items()):
            snap[(name, attr)] = value
    for integration in INTEGRATIONS:
        for seam in integration.seams:
            owner_name, _, attr = seam.name.rpartition(".")
            if owner_name:
                owner = getattr(importlib.import_module(seam.module), owner_name)
                snap[(owner, attr)] = inspect.getattr_static(owner, attr)
    return snap


@dataclass(frozen=True)
class Stock:
    """The child process before ``install()``: its emulated backend, a snapshot of the patched
    libraries (:func:`_snapshot`) and a folder for the saved models."""

    name: str
    before: dict[tuple[Any, str], Any]
    tmp: Path


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory) -> Stock:
    """The child's emulated backend brought up by its vendor package, the libraries imported,
    and the snapshot taken: all before anything is installed."""
    name = os.environ["ACCELREG_EMU_NAME"]
    importlib.import_module("torch_" + name)  # the vendor package brings the emulator up
    importlib.import_module("accelerate.utils.modeling")
    importlib.import_module("transformers.modeling_utils")
    importlib.import_module("peft.peft_model")  # accelerate's seams import it at enable() anyway
    transformers = importlib.import_module("transformers")
    for cls in ("GPT2Config", "GPT2LMHeadModel", "Qwen2Config", "Qwen2ForCausalLM"):
        getattr(transformers, cls)  # the tiny models' lazily imported modules, before the snapshot
    assert not any(i.enabled for i in INTEGRATIONS), "installed before the snapshot"
    torch.manual_seed(0)
    return Stock(name, _snapshot(), tmp_path_factory.mktemp("models"))


@contextlib.contextmanager
def _integrations_off() -> Iterator[None]:
    """The integrations uninstalled inside (when they are on), installed again after."""
    was_on = any(i.enabled for i in INTEGRATIONS)
    if was_on:
        accelreg.integrations.uninstall()
    try:
        yield
    finally:
        if was_on:
            accelreg.install()


@pytest.fixture
def without_install(stock: Stock) -> Iterator[None]:
    """For a test of the stock libraries: accelreg's integrations are off while it runs."""
    with _integrations_off():
        yield


def install_enables_the_integrations() -> list[str]:
    """``accelreg.install()``, which must enable transformers', accelerate's and peft's."""
    names = accelreg.install()
    assert {"transformers", "accelerate", "peft"} <= set(names), names
    assert all(i.enabled for i in INTEGRATIONS), [(i.name, i.enabled) for i in INTEGRATIONS]
    return names


def uninstall_restores_every_patched_attribute(stock: Stock) -> None:
    """Uninstall puts back exactly what was there (then installs again for any test after)."""
    assert all(n.enabled for n in INTEGRATIONS), [(n.name, n.enabled) for n in INTEGRATIONS]
    installed = [(i.holder, i.attr, i.original) for n in INTEGRATIONS for i in n._installed]
    least = len(ar_transformers.INTEGRATION.seams) + len(ar_accelerate.INTEGRATION.seams) + 1
    assert len(installed) >= least, installed
    accelreg.integrations.uninstall()
    try:
        assert not any(n.enabled for n in INTEGRATIONS)
        for holder, attr, original in installed:
            now = inspect.getattr_static(holder, attr) if isinstance(holder, type) else getattr(holder, attr)
            assert now is original, (holder, attr, now, original)
        # every holder that held an original before install() holds that very object again
        originals = {id(original) for _, _, original in installed}
        held = [
            (owner, attr, value) for (owner, attr), value in stock.before.items() if id(value) in originals
        ]
        assert held, "the snapshot taken before install() saw none of the patched originals"
        changed = []
        for owner, attr, value in held:
            if isinstance(owner, str):
                now = vars(sys.modules[owner]).get(attr)
            else:
                now = inspect.getattr_static(owner, attr)
            if now is not value:
                changed.append((owner, attr, now))
        assert not changed, f"not restored to the object recorded before install(): {changed}"
        # and nothing anywhere in the libraries still holds a replacement
        left = [
            (n, a)
            for n, m in _lib_modules().items()
            for a, v in list(vars(m).items())
            if getattr(getattr(v, "__func__", v), "__accelreg_original__", None) is not None
        ]
        assert not left, left
    finally:
        accelreg.install()


def qwen2(stock: Stock, path_name: str = "qwen2") -> tuple[Any, str]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64,
                      tie_word_embeddings=False)  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    path = str(stock.tmp / path_name)
    model.save_pretrained(path)
    return model, path


class CudaRecorder:
    """Wrap every function of torch.cuda (and torch.cuda.memory) with a recorder; each call is
    recorded once, with the first caller outside torch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._saved: list[tuple[types.ModuleType, str, Any]] = []

    def _wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            torch_dir = os.path.dirname(torch.__file__)
            while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
                frame = frame.f_back
            where = "?"
            if frame is not None:
                module = frame.f_globals.get("__name__", "?")
                where = f"{module}.{frame.f_code.co_name}"
            self.calls.append((name, where))
            return fn(*args, **kwargs)

        return recorded

    def __enter__(self) -> CudaRecorder:
        for module in (torch.cuda, torch.cuda.memory):
            for attr, value in list(vars(module).items()):
                if attr.startswith("__") or not isinstance(
                    value, (types.FunctionType, types.BuiltinFunctionType)
                ):
                    continue
                self._saved.append((module, attr, value))
                setattr(module, attr, self._wrap(value, f"torch.cuda.{attr}"))
        assert any(a == "is_available" for _, a, _ in self._saved)
        assert any(a == "mem_get_info" for _, a, _ in self._saved)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, attr, value in reversed(self._saved):
            setattr(module, attr, value)
        self._saved.clear()

    def names(self) -> list[tuple[str, str]]:
        # transformers 5.0-5.3's generate() asks whether a CUDA graph is being captured; that
        # query selects no device (False without CUDA) and is not a ladder accelreg replaces
        return sorted({c for c in self.calls if c[0] != "torch.cuda.is_current_stream_capturing"})


# -- seed 002 under npu, mlu and musa ----------------------------------------------------------
@dataclass(frozen=True)
class Seed002:
    """The tiny Qwen2, saved, with its CPU logits and generation; what stock loads do here."""

    name: str
    path: str
    ids: torch.Tensor
    cpu_logits: torch.Tensor
    cpu_generated: torch.Tensor
    #: Stock from_pretrained kernelizes every load by default (transformers 5.25 with
    #: ``kernels`` installed), read from what a cpu load reports
    by_default: bool
    #: whether the kernels library runs on this backend
    kernels_run_here: bool
    #: what a stock (patch-free) load needs here: kernels off where the library refuses it
    stock_kwargs: dict[str, Any]

    def load_and_generate(self, device_map: Any, **kwargs: Any) -> tuple[Any, torch.Tensor, torch.Tensor]:
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM.from_pretrained(self.path, device_map=device_map, **kwargs)
        first = next(model.parameters()).device
        out = model.generate(self.ids.to(first), max_new_tokens=3, do_sample=False)
        with torch.no_grad():
            logits = model(self.ids.to(first)).logits
        return model, out, logits

    def loads_onto(self, device_map: Any, expected_devices: set[str]) -> Any:
        """With accelreg installed: loads where expected, as on the cpu, never asking CUDA."""
        with CudaRecorder() as rec:
            model, out, logits = self.load_and_generate(device_map)
            devices = {str(p.device) for p in model.parameters()}
        assert rec.names() == [], f"torch.cuda was asked with accelreg installed: {rec.names()}"
        assert devices == expected_devices, (device_map, devices)
        assert torch.equal(out.cpu(), self.cpu_generated), (out, self.cpu_generated)
        assert torch.allclose(logits.cpu(), self.cpu_logits, atol=1e-5), (
            (logits.cpu() - self.cpu_logits).abs().max()
        )
        return model


SEED_002_BACKENDS = emu_names(
    ("npu", "mlu", "musa"), lambda name: pytest.mark.accelreg_emu(name=name, devices=2)
)


@pytest.fixture(scope="module", params=SEED_002_BACKENDS)
def seed(request: pytest.FixtureRequest, stock: Stock) -> Seed002:
    from transformers import Qwen2ForCausalLM

    assert stock.name == request.param, (stock.name, request.param)
    with _integrations_off():  # what stock transformers does here
        tiny, path = qwen2(stock)
        ids = torch.randint(0, 1000, (2, 8))
        with torch.no_grad():
            cpu_logits = tiny(ids).logits
            cpu_generated = tiny.generate(ids, max_new_tokens=3, do_sample=False)
        by_default = bool(Qwen2ForCausalLM.from_pretrained(path).use_kernels)
    kernels_run_here = ar_transformers.hub_kernels_support(stock.name)
    stock_kwargs = {} if kernels_run_here or not by_default else {"use_kernels": False}
    return Seed002(
        stock.name, path, ids, cpu_logits, cpu_generated, by_default, kernels_run_here, stock_kwargs
    )


@pytest.fixture(scope="module")
def seed_installed(seed: Seed002) -> list[str]:
    return install_enables_the_integrations()


class TestSeed002:
    def test_canary_without_accelreg_default_kernelization_fails_where_kernels_do_not_run(
        self, seed: Seed002, without_install: None
    ) -> None:
        """Before install(): transformers 5.25 hands every load's device type to the kernels
        library, whose own list of device types (cpu, cuda, mps, neuron, npu, rocm, tpu, xpu) is
        a ladder too: a backend it does not list (mlu, musa, any vendor's plugin) cannot load a
        model."""
        from transformers import Qwen2ForCausalLM

        name = seed.name
        assert not ar_transformers.INTEGRATION.enabled
        try:
            model = Qwen2ForCausalLM.from_pretrained(seed.path, device_map={"": f"{name}:0"})
        except ValueError as e:
            assert seed.by_default and not seed.kernels_run_here, (
                f"{e!r} where kernels are off or run on {name}"
            )
            assert f"Unsupported device type '{name}'" in str(e), repr(e)
            return
        assert seed.kernels_run_here or not seed.by_default, (
            CHANGED + f"stock transformers kernelizes by default and now loads on {name}, which the "
            "kernels library refuses: accelreg's hub_kernels.kernelize seam may be unneeded now"
        )
        assert model.use_kernels == seed.by_default, (model.use_kernels, seed.by_default)
        assert {p.device.type for p in model.parameters()} == {name}
        del model
        gc.collect()

    def test_canary_without_accelreg_transformers_get_max_memory_asks_cuda(
        self, seed: Seed002, without_install: None
    ) -> None:
        """Before install(): stock transformers' get_max_memory ladder still asks torch.cuda on a
        non-CUDA accelerator (transformers 5.24, integrations/accelerate.py)."""
        assert not ar_transformers.INTEGRATION.enabled and not ar_accelerate.INTEGRATION.enabled
        with CudaRecorder() as rec:
            model, out, _ = seed.load_and_generate("auto", **seed.stock_kwargs)
        assert {p.device.type for p in model.parameters()} == {seed.name}
        assert torch.equal(out.cpu(), seed.cpu_generated)
        asked = rec.names()
        assert asked, (
            CHANGED + 'device_map="auto" with stock transformers/accelerate no longer calls any '
            "torch.cuda function on a non-CUDA accelerator: the seed 002 fix may be unneeded now"
        )
        # 5.x: the get_max_memory ladder; 4.57: the reserved-memory loop of modeling_utils._get_device_map
        assert any(where.startswith("transformers.") for _, where in asked), (
            CHANGED + f"the path that asks torch.cuda moved: {asked}"
        )
        del model
        gc.collect()

    def test_patch_free_seed_002_device_map_for_loads_on_the_backend_without_cuda(
        self, seed: Seed002, without_install: None
    ) -> None:
        """Without install(): accelreg.device_map_for gives fully qualified devices of the
        registry, which stock from_pretrained loads as they are (with ``use_kernels=False`` where
        transformers kernelizes by default and the kernels library does not run:
        ``stock_kwargs``); nothing asks torch.cuda."""
        name = seed.name
        assert not ar_transformers.INTEGRATION.enabled and not ar_accelerate.INTEGRATION.enabled
        planned = accelreg.device_map_for(seed.path, {f"{name}:0": "1GiB", "cpu": "1GiB"})
        whole = {k: f"{name}:0" for k in planned}
        spread = accelreg.device_map_for(
            seed.path, {f"{name}:0": "300KiB", f"{name}:1": "1GiB", "cpu": "1GiB"}
        )
        assert set(spread.values()) == {f"{name}:0", f"{name}:1"}, spread
        for device_map, expected in ((whole, {f"{name}:0"}), (spread, {f"{name}:0", f"{name}:1"})):
            with CudaRecorder() as rec:
                model, out, logits = seed.load_and_generate(device_map, **seed.stock_kwargs)
                devices = {str(p.device) for p in model.parameters()}
            assert rec.names() == [], rec.names()
            assert devices == expected, (device_map, devices)
            assert torch.equal(out.cpu(), seed.cpu_generated)
            assert torch.allclose(logits.cpu(), seed.cpu_logits, atol=1e-5)
            del model
            gc.collect()

    def test_install_enables_the_integrations(self, seed_installed: list[str]) -> None:
        assert {"transformers", "accelerate", "peft"} <= set(seed_installed), seed_installed

    def test_auto_spreads_over_the_backend_and_never_asks_cuda(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        model = seed.loads_onto("auto", {f"{seed.name}:0", f"{seed.name}:1"})
        # what the user reads back keeps transformers' form: int indices, as upstream's planner
        assert set(model.hf_device_map.values()) == {0, 1}, model.hf_device_map
        del model
        gc.collect()

    def test_int_device_map_0_loads_on_device_0_without_cuda(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        seed.loads_onto({"": 0}, {f"{seed.name}:0"})
        gc.collect()

    def test_int_device_map_1_loads_on_device_1_without_cuda(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        seed.loads_onto({"": 1}, {f"{seed.name}:1"})
        gc.collect()

    def test_backend_name_device_map_is_device_0(self, seed: Seed002, seed_installed: list[str]) -> None:
        seed.loads_onto(seed.name, {f"{seed.name}:0"})
        gc.collect()

    def test_hub_kernels_by_default_keep_torch_layers_where_kernels_do_not_run(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        """With install(): the default kernelization of 5.25 no longer fails a load on a backend
        the kernels library does not list; the model keeps its torch layers and says so
        (use_kernels False), as upstream's fallback does for a layer without a kernel. Where
        kernels run, or were asked for explicitly, upstream's behaviour is unchanged."""
        model = seed.loads_onto({"": 1}, {f"{seed.name}:1"})
        assert model.use_kernels == (seed.by_default and seed.kernels_run_here), (
            model.use_kernels,
            seed.by_default,
        )
        del model
        gc.collect()
        if not seed.by_default or seed.kernels_run_here:
            return  # a transformers without default kernelization (< 5.25) has no KernelConfig either
        from transformers import KernelConfig, Qwen2ForCausalLM

        for asked in ({"use_kernels": True}, {"kernel_config": KernelConfig(kernel_mapping={})}):
            try:  # asked for explicitly: the kernels library's own answer stands
                Qwen2ForCausalLM.from_pretrained(seed.path, device_map={"": 0}, **asked)
            except ValueError as e:
                assert f"Unsupported device type '{seed.name}'" in str(e), (asked, repr(e))
            else:
                raise AssertionError(f"{asked} on {seed.name} loaded although the kernels library refuses it")
            gc.collect()

    def test_cuda_device_map_is_refused_naming_the_backend(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        from transformers import Qwen2ForCausalLM

        with CudaRecorder() as rec:
            try:
                Qwen2ForCausalLM.from_pretrained(seed.path, device_map="cuda")
            except accelreg.DeviceError as e:
                msg = str(e)
                assert (
                    "cuda is not available" in msg and f"{seed.name}:0" in msg and f"{seed.name}:1" in msg
                ), msg
            else:
                raise AssertionError('device_map="cuda" loaded on a machine without CUDA (remapped?)')
        assert rec.names() == [], rec.names()

    def test_bnb_4bit_placement_follows_what_bitsandbytes_runs_not_its_list(
        self, seed: Seed002, seed_installed: list[str]
    ) -> None:
        """bitsandbytes 0.50 lists npu but not mlu or musa among its devices, and its default
        kernels (torch operators) run on all three here. Placement follows what bitsandbytes runs
        on the device (the placement rule's probe of its kernels), not its list: a 4-bit load
        goes onto mlu and musa as onto npu, for the default map and a planned or written one.
        Where its kernels do not run (bitsandbytes before 0.50 on an emulated device), the load is
        refused with accelreg.PlacementError naming bitsandbytes' own error, never quantized on
        the cpu in silence."""
        import bitsandbytes
        from transformers import BitsAndBytesConfig, Qwen2ForCausalLM

        name = seed.name
        try:
            accelreg.placement_rule(name, "bnb_4bit")
            runs = True
        except accelreg.PlacementError as e:
            assert f"cannot run its 4-bit kernels on {name}" in str(e), str(e)
            runs = False
        if Version(bitsandbytes.__version__) >= Version("0.50"):
            assert runs, f"bitsandbytes {bitsandbytes.__version__}'s kernels should run on {name}"
        q = BitsAndBytesConfig(load_in_4bit=True)
        for device_map in (None, "auto", {"": 1}):
            try:
                model = Qwen2ForCausalLM.from_pretrained(
                    seed.path, device_map=device_map, quantization_config=q
                )
            except accelreg.PlacementError as e:
                assert not runs, f"refused although bitsandbytes runs on {name}: {e}"
                assert f"cannot run its 4-bit kernels on {name}" in str(e) and f"{name}:" in str(e), str(e)
                continue
            assert runs, f"a 4-bit load with device_map={device_map!r} went ahead where bitsandbytes fails"
            layer = model.model.layers[0].self_attn.q_proj
            assert type(layer).__name__ == "Linear4bit", type(layer)
            assert layer.weight.dtype == torch.uint8 and layer.weight.device.type == name, layer.weight
            assert {p.device.type for p in model.parameters()} == {name}
            del model
        gc.collect()

    def test_uninstall_restores_every_patched_attribute(
        self, stock: Stock, seed: Seed002, seed_installed: list[str]
    ) -> None:
        """After loads through the installed seams (this one's own, and those of every test
        before it in this process: it is the class's last), uninstall restores them all."""
        model = seed.loads_onto("auto", {f"{seed.name}:0", f"{seed.name}:1"})
        del model
        gc.collect()
        uninstall_restores_every_patched_attribute(stock)


# -- seed 001, bitsandbytes and peft under npu with four small devices -------------------------
@dataclass(frozen=True)
class Models:
    """The tiny GPT-2 (seed 001) with its CPU loss and gradients; the tiny Qwen2; bitsandbytes."""

    gpt2: Any
    gpt2_path: str
    gpt2_ids: torch.Tensor
    cpu_loss: float
    cpu_grads: dict[str, torch.Tensor]
    qwen: Any
    qwen_path: str
    qwen_ids: torch.Tensor
    bnb_before_050: bool


#: peft LoRA's model, spread over two devices
SPREAD = {
    "model.embed_tokens": "npu:0",
    "model.layers.0": "npu:0",
    "model.layers.1": "npu:1",
    "model.norm": "npu:1",
    "model.rotary_emb": "npu:1",
    "lm_head": "npu:1",
}


def _lora_devices(model: Any) -> dict[str, tuple[torch.device, torch.device]]:
    """lora module name -> (adapter weight device, base layer weight device)."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            base = module.get_base_layer().weight.device
            for kind in ("lora_A", "lora_B"):
                out[f"{name}.{kind}"] = (getattr(module, kind)["default"].weight.device, base)
    return out


def assert_logits_match_the_cpu(model: Any, models: Models, quantization: Any) -> None:
    """The quantized tiny Qwen2 on the device gives the logits of the same quantization on the cpu."""
    from transformers import Qwen2ForCausalLM

    ref = Qwen2ForCausalLM.from_pretrained(
        models.qwen_path, device_map="cpu", quantization_config=quantization
    )
    with torch.no_grad():
        got = model(models.qwen_ids.to(next(model.parameters()).device)).logits.cpu()
        want = ref(models.qwen_ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.fixture(scope="module")
def models(stock: Stock) -> Models:
    import bitsandbytes
    import bitsandbytes.nn.modules
    from transformers import GPT2Config, GPT2LMHeadModel

    bitsandbytes.nn.modules.has_avx512bf16 = lambda: False  # the same 4-bit kernels everywhere
    bnb_before_050 = tuple(int(x) for x in bitsandbytes.__version__.split(".")[:2]) < (0, 50)
    with _integrations_off():  # built by the stock libraries
        cfg = GPT2Config(n_layer=6, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                         bos_token_id=0, eos_token_id=0)  # fmt: skip
        gpt2 = GPT2LMHeadModel(cfg).eval()
        gpt2_path = str(stock.tmp / "gpt2")
        gpt2.save_pretrained(gpt2_path)
        gpt2_ids = torch.randint(0, 1000, (2, 16))
        gpt2.zero_grad()
        loss = gpt2(gpt2_ids, labels=gpt2_ids).loss
        loss.backward()
        cpu_grads = {n: p.grad.clone() for n, p in gpt2.named_parameters()}
        qwen, qwen_path = qwen2(stock)
        qwen_ids = torch.randint(0, 1000, (2, 8))
    return Models(
        gpt2, gpt2_path, gpt2_ids, loss.item(), cpu_grads, qwen, qwen_path, qwen_ids, bnb_before_050
    )


@pytest.fixture(scope="module")
def models_installed(models: Models) -> list[str]:
    return install_enables_the_integrations()


@pytest.mark.accelreg_emu(name="npu", devices=4, memory="1536KiB,1536KiB,1536KiB,1536KiB")
class TestModels:
    def test_install_enables_the_integrations(self, models_installed: list[str]) -> None:
        assert {"transformers", "accelerate", "peft"} <= set(models_installed), models_installed

    def test_seed_001_tied_gpt2_auto_split_keeps_wte_and_lm_head_together(
        self, models: Models, models_installed: list[str]
    ) -> None:
        from transformers import GPT2LMHeadModel

        # ~1.47 MB of float32 weights over four 1.5 MiB devices (1.35 MiB each to plan with): no device can hold it all
        weights = sum(p.numel() * p.element_size() for p in models.gpt2.parameters())
        assert weights > 0.9 * torch.npu.mem_get_info(0)[1], weights  # a split is forced
        model = GPT2LMHeadModel.from_pretrained(models.gpt2_path, device_map="auto")
        shown = model.hf_device_map
        assert all(isinstance(v, int) for v in shown.values()), shown  # transformers' own form
        dmap = {k: f"npu:{v}" for k, v in shown.items()}
        places = set(dmap.values())
        assert places <= {f"npu:{i}" for i in range(4)}, f"offloaded off the accelerators: {dmap}"
        assert len(places) >= 2, dmap
        assert model.transformer.wte.weight is model.lm_head.weight, "tie broken by the load"
        wte = model.transformer.wte.weight
        assert wte.device == model.lm_head.weight.device
        assert wte.untyped_storage().data_ptr() == model.lm_head.weight.untyped_storage().data_ptr()
        assert dmap["transformer.wte"] == dmap["lm_head"] == str(wte.device), dmap
        ids = models.gpt2_ids.to(wte.device)
        out = model(ids, labels=ids)
        assert abs(out.loss.item() - models.cpu_loss) < 1e-5, (out.loss.item(), models.cpu_loss)
        out.loss.backward()
        grad_devices: dict[str, list[str]] = {}
        for name, param in model.named_parameters():
            assert param.grad is not None, name
            assert param.grad.device == param.device, (name, param.grad.device, param.device)
            grad_devices.setdefault(str(param.device), []).append(name)
            assert torch.allclose(param.grad.cpu(), models.cpu_grads[name], atol=1e-5), name
        assert set(grad_devices) == places, (set(grad_devices), places)
        accelreg.check_device_map(model, dmap)  # accelreg accepts its own plan
        del model, out
        gc.collect()

    def test_patch_free_seed_001_device_map_for_keeps_tied_weights_together(
        self, models: Models, without_install: None
    ) -> None:
        """Without accelreg's loader seams (off for this test): the map device_map_for plans
        from the checkpoint folder loads with stock from_pretrained, tied pair together."""
        from transformers import GPT2LMHeadModel

        budgets = {f"npu:{i}": "1200KiB" for i in range(4)}
        budgets["cpu"] = "1GiB"
        dmap = accelreg.device_map_for(models.gpt2_path, budgets)
        places = set(dmap.values())
        assert places <= {f"npu:{i}" for i in range(4)} and len(places) >= 2, dmap
        model = GPT2LMHeadModel.from_pretrained(models.gpt2_path, device_map=dmap)
        assert not ar_transformers.INTEGRATION.enabled
        wte = model.transformer.wte.weight
        assert wte is model.lm_head.weight and wte.device == model.lm_head.weight.device
        ids = models.gpt2_ids.to(wte.device)
        out = model(ids, labels=ids)
        assert abs(out.loss.item() - models.cpu_loss) < 1e-5, (out.loss.item(), models.cpu_loss)
        del model, out
        gc.collect()

    def test_bnb_4bit_auto_loads_quantized_onto_npu_and_matches_cpu_4bit(
        self, models: Models, models_installed: list[str]
    ) -> None:
        """bitsandbytes 0.50 lists npu among its devices and its default (torch) 4-bit kernels
        run on the emulator: the quantized layers land on npu devices, never silently on the
        cpu."""
        import bitsandbytes
        from transformers import BitsAndBytesConfig, Qwen2ForCausalLM

        if models.bnb_before_050:
            return  # these kernels arrived in 0.50; docs/compatibility.md records the older sets
        assert "npu" in bitsandbytes.supported_torch_devices
        q = BitsAndBytesConfig(load_in_4bit=True)
        model = Qwen2ForCausalLM.from_pretrained(models.qwen_path, device_map="auto", quantization_config=q)
        places = set(model.hf_device_map.values())
        assert places and places <= set(range(4)), model.hf_device_map
        layer = model.model.layers[0].self_attn.q_proj
        assert type(layer).__name__ == "Linear4bit", type(layer)
        assert layer.weight.dtype == torch.uint8 and layer.weight.device.type == "npu", layer.weight
        assert {p.device.type for p in model.parameters()} == {"npu"}
        assert_logits_match_the_cpu(model, models, q)
        del model
        gc.collect()

    def test_bnb_8bit_auto_loads_quantized_onto_npu_and_matches_cpu_8bit(
        self, models: Models, models_installed: list[str]
    ) -> None:
        """8-bit: bitsandbytes' Int8Params._quantize swaps a cpu parameter's data for the int8
        result on the device (``self.data = CB``), which torch allows only where the runtime says
        host and device tensors are shallow-copy compatible: torch_npu and torch_mlu register that
        override, and so does the emulator. The layers land quantized on npu devices, with the
        cpu's logits."""
        from transformers import BitsAndBytesConfig, Qwen2ForCausalLM

        if models.bnb_before_050:
            return  # pins bitsandbytes 0.50's behaviour; docs/compatibility.md records the older sets
        q = BitsAndBytesConfig(load_in_8bit=True)
        assert accelreg.placement_rule("npu", "bnb_8bit").unsupported == ""
        model = Qwen2ForCausalLM.from_pretrained(models.qwen_path, device_map="auto", quantization_config=q)
        layer = model.model.layers[0].self_attn.q_proj
        assert type(layer).__name__ == "Linear8bitLt", type(layer)
        assert layer.weight.dtype == torch.int8 and layer.weight.device.type == "npu", layer.weight
        assert layer.weight.SCB.device == layer.weight.device
        assert {p.device.type for p in model.parameters()} == {"npu"}
        assert_logits_match_the_cpu(model, models, q)
        del model
        gc.collect()

    def test_bnb_8bit_without_the_runtime_override_is_refused_up_front_not_quantized_on_cpu(
        self, models: Models, models_installed: list[str]
    ) -> None:
        """A PrivateUse1 runtime that registers no shallow-copy override (the emulator with it
        turned off, as ``ACCELREG_EMU_SHALLOW_COPY=0`` does) cannot take bitsandbytes' 8-bit swap:
        the bitsandbytes placement rule for npu says so, and planning the map refuses the load
        with a PlacementError before bitsandbytes runs (issue 13); what must never happen is a
        load that silently quantizes on the cpu."""
        import bitsandbytes
        from transformers import BitsAndBytesConfig, Qwen2ForCausalLM

        if models.bnb_before_050:
            return
        torch.ops.accelreg_emu.set_shallow_copy_compatible(False)
        accelreg.reset()  # the bnb plugin asks torch again when the registry is rebuilt
        try:
            q = BitsAndBytesConfig(load_in_8bit=True)
            try:
                model = Qwen2ForCausalLM.from_pretrained(
                    models.qwen_path, device_map="auto", quantization_config=q
                )
            except accelreg.PlacementError as e:
                msg = str(e)
                assert "bitsandbytes cannot quantize 8-bit weights onto npu" in msg, msg
            else:
                devices = {str(p.device) for p in model.parameters()}
                raise AssertionError(f"an 8-bit load was not refused (parameters on {devices})")
            # the cause, directly
            param = bitsandbytes.nn.Int8Params(torch.randn(4, 4), requires_grad=False, has_fp16_weights=False)
            try:
                param.to("npu:0")
            except RuntimeError as e:
                assert "incompatible tensor type" in str(e), str(e)
            else:
                raise AssertionError(
                    CHANGED + "Int8Params quantizes onto a PrivateUse1 device without the override"
                )
        finally:
            torch.ops.accelreg_emu.set_shallow_copy_compatible(True)
            accelreg.reset()
        gc.collect()

    def test_peft_lora_on_a_spread_model_follows_each_base_layer_and_reloads(
        self, models: Models, models_installed: list[str], tmp_path: Path
    ) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import Qwen2ForCausalLM

        ids = models.qwen_ids
        base = Qwen2ForCausalLM.from_pretrained(models.qwen_path, device_map=SPREAD)
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        model = get_peft_model(base, cfg)
        devices = _lora_devices(model)
        assert len(devices) == 2 * 2 * 2, devices  # 2 layers x (q, v) x (A, B)
        for name, (adapter, base_dev) in devices.items():
            assert adapter == base_dev, (name, adapter, base_dev)
        assert {str(d) for d, _ in devices.values()} == {"npu:0", "npu:1"}, devices
        with torch.no_grad():
            want = model(ids.to("npu:0")).logits.cpu()
        assert not torch.allclose(want, models.qwen(ids).logits, atol=1e-4), "the adapter changes nothing"
        saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if "lora_" in k}
        adapter_dir = str(tmp_path / "lora")
        model.save_pretrained(adapter_dir)
        del model, base
        gc.collect()

        fresh = Qwen2ForCausalLM.from_pretrained(models.qwen_path, device_map=SPREAD)
        loaded = PeftModel.from_pretrained(fresh, adapter_dir)
        devices = _lora_devices(loaded)
        for name, (adapter, base_dev) in devices.items():
            assert adapter == base_dev, (name, adapter, base_dev)
        assert {str(d) for d, _ in devices.values()} == {"npu:0", "npu:1"}, devices
        state = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
        assert set(state) == set(saved), (sorted(state), sorted(saved))
        for key, value in state.items():
            assert torch.equal(value.cpu(), saved[key]), key
        with torch.no_grad():
            got = loaded(ids.to("npu:0")).logits.cpu()
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        del loaded, fresh
        gc.collect()

    def test_uninstall_restores_every_patched_attribute(
        self, stock: Stock, models: Models, models_installed: list[str]
    ) -> None:
        """After loads through the installed seams (this one's own, and those of every test
        before it in this process: it is the class's last), uninstall restores them all."""
        from peft import LoraConfig, get_peft_model
        from transformers import Qwen2ForCausalLM

        base = Qwen2ForCausalLM.from_pretrained(models.qwen_path, device_map=SPREAD)
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
        assert {str(d) for d, _ in _lora_devices(model).values()} == {"npu:0", "npu:1"}
        del model, base
        gc.collect()
        uninstall_restores_every_patched_attribute(stock)
