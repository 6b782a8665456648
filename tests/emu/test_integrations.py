"""``accelreg.install()`` end to end on the emulated accelerator: transformers, accelerate and
peft ask the registry, and nothing asks CUDA.

Two check scripts, one process each per emulated backend (PrivateUse1 can be renamed once per
process):

* ``SEED_002`` — seed 002 under ``npu``, ``mlu`` and ``musa`` impersonation (2 devices): first a
  canary that names the upstream path that still asks ``torch.cuda`` without accelreg, then
  with ``install()``: a tiny Qwen2 loads with ``device_map="auto"``, ``{"": 0}``, ``{"": 1}`` and
  ``"<backend>"``, generates, matches the CPU logits, and not one ``torch.cuda`` function is
  called; ``device_map="cuda"`` is refused (never remapped).
* ``MODELS`` — under ``npu`` with 4 small devices: seed 001 (GPT-2's tied ``wte``/``lm_head``
  planned as one unit across a forced split), bitsandbytes 8-bit and 4-bit with
  ``device_map="auto"`` (8-bit also on a runtime without the shallow-copy override: refused up
  front), and peft LoRA on a model spread over two devices.

Both end by uninstalling and checking that every patched attribute is the identical object it
was before ``install()``. The models are random-initialised and saved to a temporary
directory; nothing is downloaded. The upstream canaries without accelreg for seeds 001/002
are in test_emu_models.py.
"""

from __future__ import annotations

import pytest

from ._runner import check_names, run_checks

pytestmark = pytest.mark.emu

# Shared prologue: the backend's vendor package, the libraries, and a snapshot of every
# module-level attribute of the patched libraries taken before install().
_PROLOGUE = r'''
import gc, importlib, inspect, os, sys, tempfile
import torch

NAME = os.environ["ACCELREG_EMU_NAME"]
importlib.import_module("torch_" + NAME)       # the vendor package brings the emulator up
import accelreg
import accelreg.integrations
from accelreg.integrations import accelerate as _ar_acc, peft as _ar_peft, transformers as _ar_tf
import accelerate.utils.modeling
import transformers.modeling_utils
import peft, peft.peft_model  # accelerate's seams import it at enable() anyway
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

LIBS = ("transformers", "accelerate", "peft")
CHANGED = "upstream changed: "
torch.manual_seed(0)
TMP = tempfile.mkdtemp()


def _lib_modules():
    return {n: m for n, m in list(sys.modules.items())
            if m is not None and n.split(".")[0] in LIBS}


def _snapshot():
    """(module name, attr) -> object, for every attribute of every module of the libraries,
    and (class, attr) -> the raw class attribute of every class seam."""
    snap = {}
    for name, module in _lib_modules().items():
        for attr, value in list(vars(module).items()):
            snap[(name, attr)] = value
    for integration in (_ar_tf.INTEGRATION, _ar_acc.INTEGRATION, _ar_peft.INTEGRATION):
        for seam in integration.seams:
            owner_name, _, attr = seam.name.rpartition(".")
            if owner_name:
                owner = getattr(importlib.import_module(seam.module), owner_name)
                snap[(owner, attr)] = inspect.getattr_static(owner, attr)
    return snap


def qwen2(path_name="qwen2"):
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    path = os.path.join(TMP, path_name)
    model.save_pretrained(path)
    return model, path


BEFORE = _snapshot()
'''

# Shared epilogue: uninstall restores exactly what was there.
_EPILOGUE = r"""
def check_uninstall_restores_every_patched_attribute():
    integrations = (_ar_tf.INTEGRATION, _ar_acc.INTEGRATION, _ar_peft.INTEGRATION)
    assert all(n.enabled for n in integrations), [(n.name, n.enabled) for n in integrations]
    installed = [(i.holder, i.attr, i.original) for n in integrations for i in n._installed]
    assert len(installed) >= len(_ar_tf.INTEGRATION.seams) + len(_ar_acc.INTEGRATION.seams) + 1, installed
    accelreg.integrations.uninstall()
    assert not any(n.enabled for n in integrations)
    for holder, attr, original in installed:
        now = inspect.getattr_static(holder, attr) if isinstance(holder, type) else getattr(holder, attr)
        assert now is original, (holder, attr, now, original)
    # every holder that held an original before install() holds that very object again
    originals = {id(original) for _, _, original in installed}
    held = [(owner, attr, value) for (owner, attr), value in BEFORE.items() if id(value) in originals]
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
    left = [(n, a) for n, m in _lib_modules().items() for a, v in list(vars(m).items())
            if getattr(getattr(v, "__func__", v), "__accelreg_original__", None) is not None]
    assert not left, left
"""

SEED_002 = (
    _PROLOGUE
    + r'''
import functools, types

TINY, TINY_PATH = qwen2()
IDS = torch.randint(0, 1000, (2, 8))
with torch.no_grad():
    CPU_LOGITS = TINY(IDS).logits
    CPU_GENERATED = TINY.generate(IDS, max_new_tokens=3, do_sample=False)


class CudaRecorder:
    """Wrap every function of torch.cuda (and torch.cuda.memory) with a recorder; each call is
    recorded once, with the first caller outside torch."""

    def __init__(self):
        self.calls = []
        self._saved = []

    def _wrap(self, fn, name):
        @functools.wraps(fn)
        def recorded(*args, **kwargs):
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

    def __enter__(self):
        for module in (torch.cuda, torch.cuda.memory):
            for attr, value in list(vars(module).items()):
                if attr.startswith("__") or not isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
                    continue
                self._saved.append((module, attr, value))
                setattr(module, attr, self._wrap(value, f"torch.cuda.{attr}"))
        assert any(a == "is_available" for _, a, _ in self._saved)
        assert any(a == "mem_get_info" for _, a, _ in self._saved)
        return self

    def __exit__(self, *exc):
        for module, attr, value in reversed(self._saved):
            setattr(module, attr, value)
        self._saved.clear()

    def names(self):
        # transformers 5.0-5.3's generate() asks whether a CUDA graph is being captured; that
        # query selects no device (False without CUDA) and is not a ladder accelreg replaces
        return sorted({c for c in self.calls if c[0] != "torch.cuda.is_current_stream_capturing"})


def load_and_generate(device_map, **kwargs):
    model = Qwen2ForCausalLM.from_pretrained(TINY_PATH, device_map=device_map, **kwargs)
    first = next(model.parameters()).device
    out = model.generate(IDS.to(first), max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        logits = model(IDS.to(first)).logits
    return model, out, logits


#: Stock from_pretrained kernelizes every load by default (transformers 5.25 with ``kernels``
#: installed), read from what a cpu load reports; and whether the kernels library runs on NAME.
BY_DEFAULT = bool(Qwen2ForCausalLM.from_pretrained(TINY_PATH).use_kernels)
KERNELS_RUN_HERE = _ar_tf.hub_kernels_support(NAME)
#: What a stock (patch-free) load needs on this backend: kernels off where the library refuses it.
STOCK = {} if KERNELS_RUN_HERE or not BY_DEFAULT else {"use_kernels": False}


def check_canary_without_accelreg_default_kernelization_fails_where_kernels_do_not_run():
    """Before install(): transformers 5.25 hands every load's device type to the kernels
    library, whose own list of device types (cpu, cuda, mps, neuron, npu, rocm, tpu, xpu) is a
    ladder too: a backend it does not list (mlu, musa, any vendor's plugin) cannot load a model."""
    assert not _ar_tf.INTEGRATION.enabled
    try:
        model = Qwen2ForCausalLM.from_pretrained(TINY_PATH, device_map={"": f"{NAME}:0"})
    except ValueError as e:
        assert BY_DEFAULT and not KERNELS_RUN_HERE, f"{e!r} where kernels are off or run on {NAME}"
        assert f"Unsupported device type '{NAME}'" in str(e), repr(e)
        return
    assert KERNELS_RUN_HERE or not BY_DEFAULT, (
        CHANGED + f"stock transformers kernelizes by default and now loads on {NAME}, which the kernels "
        "library refuses: accelreg's hub_kernels.kernelize seam may be unneeded now"
    )
    assert model.use_kernels == BY_DEFAULT, (model.use_kernels, BY_DEFAULT)
    assert {p.device.type for p in model.parameters()} == {NAME}
    del model
    gc.collect()


def check_canary_without_accelreg_transformers_get_max_memory_asks_cuda():
    """Before install(): stock transformers' get_max_memory ladder still asks torch.cuda on a
    non-CUDA accelerator (transformers 5.24, integrations/accelerate.py)."""
    assert not _ar_tf.INTEGRATION.enabled and not _ar_acc.INTEGRATION.enabled
    with CudaRecorder() as rec:
        model, out, _ = load_and_generate("auto", **STOCK)
    assert {p.device.type for p in model.parameters()} == {NAME}
    assert torch.equal(out.cpu(), CPU_GENERATED)
    asked = rec.names()
    assert asked, (
        CHANGED + 'device_map="auto" with stock transformers/accelerate no longer calls any torch.cuda '
        "function on a non-CUDA accelerator; accelreg's transformers get_max_memory seam may be unneeded now"
    )
    # 5.x: the get_max_memory ladder; 4.57: the reserved-memory loop of modeling_utils._get_device_map
    assert any(where.startswith("transformers.") for _, where in asked), (
        CHANGED + f"the path that asks torch.cuda moved: {asked}"
    )
    del model
    gc.collect()


def check_patch_free_seed_002_device_map_for_loads_on_the_backend_without_cuda():
    """Without install(): accelreg.device_map_for gives fully qualified devices of the registry,
    which stock from_pretrained loads as they are (with ``use_kernels=False`` where transformers
    kernelizes by default and the kernels library does not run: ``STOCK``); nothing asks
    torch.cuda."""
    assert not _ar_tf.INTEGRATION.enabled and not _ar_acc.INTEGRATION.enabled
    whole = {k: f"{NAME}:0" for k in accelreg.device_map_for(TINY_PATH, {f"{NAME}:0": "1GiB", "cpu": "1GiB"})}
    spread = accelreg.device_map_for(TINY_PATH, {f"{NAME}:0": "300KiB", f"{NAME}:1": "1GiB", "cpu": "1GiB"})
    assert set(spread.values()) == {f"{NAME}:0", f"{NAME}:1"}, spread
    for device_map, expected in ((whole, {f"{NAME}:0"}), (spread, {f"{NAME}:0", f"{NAME}:1"})):
        with CudaRecorder() as rec:
            model, out, logits = load_and_generate(device_map, **STOCK)
            devices = {str(p.device) for p in model.parameters()}
        assert rec.names() == [], rec.names()
        assert devices == expected, (device_map, devices)
        assert torch.equal(out.cpu(), CPU_GENERATED)
        assert torch.allclose(logits.cpu(), CPU_LOGITS, atol=1e-5)
        del model
        gc.collect()


def check_install_enables_the_integrations():
    names = accelreg.install()
    assert {"transformers", "accelerate", "peft"} <= set(names), names
    assert _ar_tf.INTEGRATION.enabled and _ar_acc.INTEGRATION.enabled and _ar_peft.INTEGRATION.enabled


def _loads_onto(device_map, expected_devices):
    with CudaRecorder() as rec:
        model, out, logits = load_and_generate(device_map)
        devices = {str(p.device) for p in model.parameters()}
    assert rec.names() == [], f"torch.cuda was asked with accelreg installed: {rec.names()}"
    assert devices == expected_devices, (device_map, devices)
    assert torch.equal(out.cpu(), CPU_GENERATED), (out, CPU_GENERATED)
    assert torch.allclose(logits.cpu(), CPU_LOGITS, atol=1e-5), (logits.cpu() - CPU_LOGITS).abs().max()
    return model


def check_auto_spreads_over_the_backend_and_never_asks_cuda():
    model = _loads_onto("auto", {f"{NAME}:0", f"{NAME}:1"})
    # what the user reads back keeps transformers' form: int indices, as upstream's planner
    assert set(model.hf_device_map.values()) == {0, 1}, model.hf_device_map
    del model
    gc.collect()


def check_int_device_map_0_loads_on_device_0_without_cuda():
    _loads_onto({"": 0}, {f"{NAME}:0"})
    gc.collect()


def check_int_device_map_1_loads_on_device_1_without_cuda():
    _loads_onto({"": 1}, {f"{NAME}:1"})
    gc.collect()


def check_backend_name_device_map_is_device_0():
    _loads_onto(NAME, {f"{NAME}:0"})
    gc.collect()


def check_hub_kernels_by_default_keep_torch_layers_where_kernels_do_not_run():
    """With install(): the default kernelization of 5.25 no longer fails a load on a backend the
    kernels library does not list; the model keeps its torch layers and says so
    (use_kernels False), as upstream's fallback does for a layer without a kernel. Where kernels
    run, or were asked for explicitly, upstream's behaviour is unchanged."""
    model = _loads_onto({"": 1}, {f"{NAME}:1"})
    assert model.use_kernels == (BY_DEFAULT and KERNELS_RUN_HERE), (model.use_kernels, BY_DEFAULT)
    del model
    gc.collect()
    if not BY_DEFAULT or KERNELS_RUN_HERE:
        return
    from transformers import KernelConfig

    for asked in ({"use_kernels": True}, {"kernel_config": KernelConfig(kernel_mapping={})}):
        try:  # asked for explicitly: the kernels library's own answer stands
            Qwen2ForCausalLM.from_pretrained(TINY_PATH, device_map={"": 0}, **asked)
        except ValueError as e:
            assert f"Unsupported device type '{NAME}'" in str(e), (asked, repr(e))
        else:
            raise AssertionError(f"{asked} on {NAME} loaded although the kernels library refuses it")
        gc.collect()


def check_cuda_device_map_is_refused_naming_the_backend():
    with CudaRecorder() as rec:
        try:
            Qwen2ForCausalLM.from_pretrained(TINY_PATH, device_map="cuda")
        except accelreg.DeviceError as e:
            msg = str(e)
            assert "cuda is not available" in msg and f"{NAME}:0" in msg and f"{NAME}:1" in msg, msg
        else:
            raise AssertionError('device_map="cuda" loaded on a machine without CUDA (remapped?)')
    assert rec.names() == [], rec.names()


def check_bnb_4bit_is_refused_where_bitsandbytes_does_not_run():
    """bitsandbytes 0.50 supports npu but not mlu or musa: under those a 4-bit load is refused
    with accelreg.PlacementError for the default map and for a planned one alike (it would
    otherwise run on the emulator, which is not the hardware bitsandbytes vouches for).
    npu's positive case is test_models' check_bnb_4bit_auto_*."""
    import bitsandbytes
    from transformers import BitsAndBytesConfig

    supported = bitsandbytes.supported_torch_devices
    if NAME == "npu":
        assert "npu" in supported, supported
        return
    assert NAME not in supported, supported
    q = BitsAndBytesConfig(load_in_4bit=True)
    for device_map in (None, "auto", {"": 1}):
        try:
            model = Qwen2ForCausalLM.from_pretrained(TINY_PATH, device_map=device_map, quantization_config=q)
        except accelreg.PlacementError as e:
            msg = str(e)
            assert f"cannot run on {NAME}" in msg and "npu" in msg and f"{NAME}:" in msg, msg
        else:
            devices = {str(p.device) for p in model.parameters()}
            raise AssertionError(f"a 4-bit load with device_map={device_map!r} went ahead on {devices}")
    gc.collect()
'''
    + _EPILOGUE
)

MODELS = (
    _PROLOGUE
    + r'''
import bitsandbytes
import bitsandbytes.nn.modules
from transformers import BitsAndBytesConfig

bitsandbytes.nn.modules.has_avx512bf16 = lambda: False   # the same 4-bit kernels everywhere
BNB_BEFORE_050 = tuple(int(x) for x in bitsandbytes.__version__.split(".")[:2]) < (0, 50)
MIB = 1 << 20


def check_install_enables_the_integrations():
    names = accelreg.install()
    assert {"transformers", "accelerate", "peft"} <= set(names), names
    assert _ar_tf.INTEGRATION.enabled and _ar_acc.INTEGRATION.enabled and _ar_peft.INTEGRATION.enabled


# -- seed 001: tied weights planned as one unit --------------------------------------------
GPT2_CFG = GPT2Config(n_layer=6, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                      bos_token_id=0, eos_token_id=0)
GPT2 = GPT2LMHeadModel(GPT2_CFG).eval()
GPT2_PATH = os.path.join(TMP, "gpt2")
GPT2.save_pretrained(GPT2_PATH)
GPT2_IDS = torch.randint(0, 1000, (2, 16))
GPT2.zero_grad()
_loss = GPT2(GPT2_IDS, labels=GPT2_IDS).loss
_loss.backward()
CPU_LOSS = _loss.item()
CPU_GRADS = {n: p.grad.clone() for n, p in GPT2.named_parameters()}


def check_seed_001_tied_gpt2_auto_split_keeps_wte_and_lm_head_together():
    # ~1.47 MB of float32 weights over four 1.5 MiB devices (1.35 MiB each to plan with): no device can hold it all
    weights = sum(p.numel() * p.element_size() for p in GPT2.parameters())
    assert weights > 0.9 * torch.npu.mem_get_info(0)[1], weights      # a split is forced
    model = GPT2LMHeadModel.from_pretrained(GPT2_PATH, device_map="auto")
    shown = model.hf_device_map
    assert all(isinstance(v, int) for v in shown.values()), shown   # transformers' own form
    dmap = {k: f"npu:{v}" for k, v in shown.items()}
    places = set(dmap.values())
    assert places <= {f"npu:{i}" for i in range(4)}, f"offloaded off the accelerators: {dmap}"
    assert len(places) >= 2, dmap
    assert model.transformer.wte.weight is model.lm_head.weight, "tie broken by the load"
    wte = model.transformer.wte.weight
    assert wte.device == model.lm_head.weight.device
    assert wte.untyped_storage().data_ptr() == model.lm_head.weight.untyped_storage().data_ptr()
    assert dmap["transformer.wte"] == dmap["lm_head"] == str(wte.device), dmap
    out = model(GPT2_IDS.to(wte.device), labels=GPT2_IDS.to(wte.device))
    assert abs(out.loss.item() - CPU_LOSS) < 1e-5, (out.loss.item(), CPU_LOSS)
    out.loss.backward()
    grad_devices = {}
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.device == param.device, (name, param.grad.device, param.device)
        grad_devices.setdefault(str(param.device), []).append(name)
        assert torch.allclose(param.grad.cpu(), CPU_GRADS[name], atol=1e-5), name
    assert set(grad_devices) == places, (set(grad_devices), places)
    accelreg.check_device_map(model, dmap)   # accelreg accepts its own plan
    del model, out
    gc.collect()


def check_patch_free_seed_001_device_map_for_keeps_tied_weights_together():
    """Without accelreg's loader seams (uninstalled for the check): the map device_map_for
    plans from the checkpoint folder loads with stock from_pretrained, tied pair together."""
    accelreg.integrations.uninstall()
    try:
        budgets = {f"npu:{i}": "1200KiB" for i in range(4)}
        budgets["cpu"] = "1GiB"
        dmap = accelreg.device_map_for(GPT2_PATH, budgets)
        places = set(dmap.values())
        assert places <= {f"npu:{i}" for i in range(4)} and len(places) >= 2, dmap
        model = GPT2LMHeadModel.from_pretrained(GPT2_PATH, device_map=dmap)
        assert not _ar_tf.INTEGRATION.enabled
        wte = model.transformer.wte.weight
        assert wte is model.lm_head.weight and wte.device == model.lm_head.weight.device
        out = model(GPT2_IDS.to(wte.device), labels=GPT2_IDS.to(wte.device))
        assert abs(out.loss.item() - CPU_LOSS) < 1e-5, (out.loss.item(), CPU_LOSS)
        del model, out
        gc.collect()
    finally:
        accelreg.install()


# -- bitsandbytes ------------------------------------------------------------------------
QWEN, QWEN_PATH = qwen2()
QWEN_IDS = torch.randint(0, 1000, (2, 8))


def check_bnb_4bit_auto_loads_quantized_onto_npu_and_matches_cpu_4bit():
    """bitsandbytes 0.50 lists npu among its devices and its default (torch) 4-bit kernels run
    on the emulator: the quantized layers land on npu devices, never silently on the cpu."""
    if BNB_BEFORE_050:
        return  # these kernels arrived in 0.50; docs/compatibility.md records the older sets
    assert "npu" in bitsandbytes.supported_torch_devices
    q = BitsAndBytesConfig(load_in_4bit=True)
    model = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map="auto", quantization_config=q)
    places = set(model.hf_device_map.values())
    assert places and places <= set(range(4)), model.hf_device_map
    layer = model.model.layers[0].self_attn.q_proj
    assert type(layer).__name__ == "Linear4bit", type(layer)
    assert layer.weight.dtype == torch.uint8 and layer.weight.device.type == "npu", layer.weight
    assert {p.device.type for p in model.parameters()} == {"npu"}
    ref = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map="cpu", quantization_config=q)
    first = next(model.parameters()).device
    with torch.no_grad():
        got = model(QWEN_IDS.to(first)).logits.cpu()
        want = ref(QWEN_IDS).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    del model, ref
    gc.collect()


def check_bnb_8bit_auto_loads_quantized_onto_npu_and_matches_cpu_8bit():
    """8-bit: bitsandbytes' Int8Params._quantize swaps a cpu parameter's data for the int8 result
    on the device (``self.data = CB``), which torch allows only where the runtime says host and
    device tensors are shallow-copy compatible: torch_npu and torch_mlu register that override,
    and so does the emulator. The layers land quantized on npu devices, with the cpu's logits."""
    if BNB_BEFORE_050:
        return  # pins bitsandbytes 0.50's behaviour; docs/compatibility.md records the older sets
    q = BitsAndBytesConfig(load_in_8bit=True)
    assert accelreg.placement_rule("npu", "bnb_8bit").unsupported == ""
    model = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map="auto", quantization_config=q)
    layer = model.model.layers[0].self_attn.q_proj
    assert type(layer).__name__ == "Linear8bitLt", type(layer)
    assert layer.weight.dtype == torch.int8 and layer.weight.device.type == "npu", layer.weight
    assert layer.weight.SCB.device == layer.weight.device
    assert {p.device.type for p in model.parameters()} == {"npu"}
    ref = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map="cpu", quantization_config=q)
    with torch.no_grad():
        got = model(QWEN_IDS.to(next(model.parameters()).device)).logits.cpu()
        want = ref(QWEN_IDS).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    del model, ref
    gc.collect()


def check_bnb_8bit_without_the_runtime_override_is_refused_up_front_not_quantized_on_cpu():
    """A PrivateUse1 runtime that registers no shallow-copy override (the emulator with it turned
    off, as ``ACCELREG_EMU_SHALLOW_COPY=0`` does) cannot take bitsandbytes' 8-bit swap: the
    bitsandbytes placement rule for npu says so, and planning the map refuses the load with a
    PlacementError before bitsandbytes runs (issue 13); what must never happen is a load that
    silently quantizes on the cpu."""
    if BNB_BEFORE_050:
        return
    torch.ops.accelreg_emu.set_shallow_copy_compatible(False)
    accelreg.reset()  # the bnb plugin asks torch again when the registry is rebuilt
    try:
        q = BitsAndBytesConfig(load_in_8bit=True)
        try:
            model = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map="auto", quantization_config=q)
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
            raise AssertionError(CHANGED + "Int8Params quantizes onto a PrivateUse1 device without the override")
    finally:
        torch.ops.accelreg_emu.set_shallow_copy_compatible(True)
        accelreg.reset()
    gc.collect()


# -- peft LoRA on a model spread over two devices --------------------------------------------
SPREAD = {"model.embed_tokens": "npu:0", "model.layers.0": "npu:0", "model.layers.1": "npu:1",
          "model.norm": "npu:1", "model.rotary_emb": "npu:1", "lm_head": "npu:1"}


def _lora_devices(model):
    """lora module name -> (adapter weight device, base layer weight device)."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            base = module.get_base_layer().weight.device
            for kind in ("lora_A", "lora_B"):
                out[f"{name}.{kind}"] = (getattr(module, kind)["default"].weight.device, base)
    return out


def check_peft_lora_on_a_spread_model_follows_each_base_layer_and_reloads():
    from peft import LoraConfig, PeftModel, get_peft_model

    base = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map=SPREAD)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, cfg)
    devices = _lora_devices(model)
    assert len(devices) == 2 * 2 * 2, devices          # 2 layers x (q, v) x (A, B)
    for name, (adapter, base_dev) in devices.items():
        assert adapter == base_dev, (name, adapter, base_dev)
    assert {str(d) for d, _ in devices.values()} == {"npu:0", "npu:1"}, devices
    with torch.no_grad():
        want = model(QWEN_IDS.to("npu:0")).logits.cpu()
    assert not torch.allclose(want, QWEN(QWEN_IDS).logits, atol=1e-4), "the adapter changes nothing"
    saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if "lora_" in k}
    adapter_dir = os.path.join(TMP, "lora")
    model.save_pretrained(adapter_dir)
    del model, base
    gc.collect()

    fresh = Qwen2ForCausalLM.from_pretrained(QWEN_PATH, device_map=SPREAD)
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
        got = loaded(QWEN_IDS.to("npu:0")).logits.cpu()
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    del loaded, fresh
    gc.collect()
'''
    + _EPILOGUE
)


@pytest.fixture(scope="module", params=["npu", "mlu", "musa"])
def seed_002_results(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    return request.param, run_checks(SEED_002, request.param, devices=2)


@pytest.mark.parametrize("check", check_names(SEED_002))
def test_seed_002(seed_002_results: tuple[str, dict[str, str]], check: str) -> None:
    _, results = seed_002_results
    assert results[check] == "ok", results[check]


@pytest.fixture(scope="module")
def model_results() -> dict[str, str]:
    return run_checks(MODELS, "npu", devices=4, memory="1536KiB,1536KiB,1536KiB,1536KiB")


@pytest.mark.parametrize("check", check_names(MODELS))
def test_models(model_results: dict[str, str], check: str) -> None:
    assert model_results[check] == "ok", model_results[check]
