"""Tensor basics, the same-device rule, memory budgets and the device module, on an
emulated two-device ``npu`` (one child process for the whole module)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import io
import os
from collections.abc import Callable
from types import ModuleType

import accelreg_emu
import pytest
import torch

from ._identity import module_to_keeps_parameters, opt_out_makes_new_parameters

MIB = 1 << 20
N = 2  # devices of the emulated npu (the marker's)
SAME = "Expected all tensors to be on the same device, but found at least two devices"

pytestmark = [pytest.mark.emu, pytest.mark.accelreg_emu(name="npu", devices=N, memory=f"{64 * MIB},32MiB")]


@pytest.fixture(scope="module", autouse=True)
def torch_npu() -> ModuleType:
    """The vendor package, as a user imports it: it brings the emulated npu up (in the child)."""
    return importlib.import_module("torch_npu")


def dev(i: int) -> torch.device:
    return torch.device("npu", i)


def raises(fn: Callable[[], object], exc: type[BaseException], *fragments: str) -> str:
    try:
        fn()
    except exc as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, f"{f!r} not in {msg!r}"
        return msg
    raise AssertionError(f"no {exc.__name__} raised")


def test_device_count_and_config() -> None:
    assert torch.npu.device_count() == N == 2 and torch.npu.is_available()
    cfg = accelreg_emu.config()
    assert cfg["name"] == "npu" and cfg["devices"] == 2 and cfg["active"], cfg
    assert cfg["capacities"] == [64 * MIB, 32 * MIB], cfg


def test_factories_on_every_device() -> None:
    for i in range(N):
        made = [
            torch.zeros(3, device=dev(i)),
            torch.ones(2, 3, device=f"npu:{i}"),
            torch.full((2,), 7.0, device=dev(i)),
            torch.arange(5, device=dev(i)),
            torch.randn(4, device=dev(i)),
            torch.rand(2, 2, device=dev(i)),
            torch.empty(2, 2, device=dev(i)),
            torch.tensor([1, 2, 3], device=dev(i)),
            torch.eye(3, device=dev(i)),
            torch.zeros_like(torch.ones(2), device=dev(i)),
            torch.empty_strided((2, 3), (1, 2), device=dev(i)),
            torch.linspace(0, 1, 5, device=dev(i)),
        ]
        for t in made:
            assert t.device == dev(i), (t.device, i)
    assert torch.ones(3, device="npu:1").tolist() == [1.0, 1.0, 1.0]
    assert torch.arange(4, device="npu:1").sum().item() == 6
    with torch.npu.device(1):
        assert torch.empty(1, device="npu").device == dev(1)
    assert torch.empty(1, device="npu").device == dev(0)


def test_to_between_devices_and_cpu() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    a = x.to("npu:0")
    b = a.to("npu:1")
    assert a.device == dev(0) and b.device == dev(1)
    assert torch.equal(b.cpu(), x) and torch.equal(b.to("cpu"), x)
    assert torch.equal(b.to(torch.float64).cpu(), x.double())
    assert torch.equal(x.to(dev(1), dtype=torch.int32).cpu(), x.int())
    assert torch.equal(x.t().to("npu:1").cpu(), x.t())
    y = torch.empty(4, 3, device=dev(0))
    y.copy_(b.t())
    assert torch.equal(y.cpu(), x.t())
    z = torch.empty(3, 4)
    z.copy_(b)
    assert torch.equal(z, x)
    assert b.to("npu:1") is b
    assert torch.equal(x.npu(1).cpu(), x) and x.npu(1).is_npu


def test_module_to_keeps_its_parameters_as_on_cuda() -> None:
    module_to_keeps_parameters(dev(1))
    module_to_keeps_parameters(dev(0))


def test_without_the_override_module_to_makes_new_parameters() -> None:
    opt_out_makes_new_parameters(dev(1))


def test_views_share_storage() -> None:
    for i in range(N):
        a = torch.arange(12.0, device=dev(i))
        v = a.view(3, 4)
        v[1].fill_(-1)
        assert a[4:8].tolist() == [-1.0] * 4
        t = v.t()
        assert not t.is_contiguous() and t.device == dev(i) and t.data_ptr() == a.data_ptr()
        assert v.reshape(2, 6).data_ptr() == a.data_ptr()
        assert a.unfold(0, 4, 4).shape == (3, 4)
        assert v[:, :1].expand(3, 5).shape == (3, 5)
        assert v.diagonal().tolist() == [0.0, -1.0, 10.0]
        assert v.narrow(1, 1, 2).tolist()[0] == [1.0, 2.0]
        assert v.permute(1, 0).unsqueeze(0).shape == (1, 4, 3)
        assert a.view(torch.int32).dtype == torch.int32 and a.view(torch.int32).data_ptr() == a.data_ptr()
        parts = a.split(4)
        assert len(parts) == 3 and parts[2].data_ptr() == a.data_ptr() + 8 * a.element_size()
        c = torch.view_as_complex(torch.ones(2, 2, device=dev(i)))
        assert torch.view_as_real(c).shape == (2, 2)


def test_inplace_ops() -> None:
    for i in range(N):
        a = torch.ones(4, device=dev(i))
        a.add_(1).mul_(3)
        a[1] = 0
        a.clamp_(max=5)
        a.masked_fill_(a == 0, 9)
        assert a.tolist() == [5.0, 9.0, 5.0, 5.0] and a.device == dev(i)
        b = torch.zeros(2, 3, device=dev(i))
        b.index_add_(0, torch.tensor([1], device=dev(i)), torch.ones(1, 3, device=dev(i)))
        b.resize_(3, 3)
        assert b.shape == (3, 3) and b[1, :].tolist() == [1.0, 1.0, 1.0]
        b.zero_()
        assert b.sum().item() == 0


def test_lazy_conjugate_and_negative_bits() -> None:
    # torch.fft.ifft of a real tensor returns a lazy conjugate (peft's C3A and FourierFT
    # adapters use it); reading one back used to recurse in _copy_from until the process crashed
    x, w = torch.randn(4, 3, 8), torch.randn(5, 3, 8)
    for i in range(N):
        f, ref = torch.fft.ifft(x.to(dev(i))), torch.fft.ifft(x)
        assert f.is_conj() and torch.equal(f.cpu(), ref)
        out = torch.einsum("...nb,mnb->...mb", f, torch.fft.fft(w.to(dev(i))))
        assert torch.allclose(out.cpu(), torch.einsum("...nb,mnb->...mb", ref, torch.fft.fft(w)), atol=1e-5)
        z = torch.complex(x, -x)
        neg = z.to(dev(i)).conj().imag  # a lazy negative view
        assert neg.is_neg() and torch.equal(neg.cpu(), x) and torch.equal(neg.to(dev(N - 1 - i)).cpu(), x)
        copied = torch.empty_like(f)
        copied.copy_(f)
        assert torch.equal(copied.cpu(), ref)


def test_convolutions_forward_and_backward_match_the_cpu() -> None:
    # without cuDNN or MKL-DNN torch sends a device's convolutions to convolution_overrideable
    # (and its backward), whose CPU kernels are stubs that throw: every Conv and ConvTranspose
    # module failed on the emulator (peft's WaveFT adapter, any vision or audio encoder)
    torch.manual_seed(0)
    modules = [
        torch.nn.Conv1d(4, 6, 3, padding=1, groups=2, bias=False),
        torch.nn.Conv2d(3, 5, 3, stride=2),
        torch.nn.ConvTranspose2d(4, 3, 3, stride=2, output_padding=1),
        torch.nn.ConvTranspose1d(4, 6, 2, groups=2),
        torch.nn.Conv3d(2, 3, 2),
    ]
    inputs = [
        torch.randn(2, 4, 9),
        torch.randn(2, 3, 9, 9),
        torch.randn(2, 4, 5, 5),
        torch.randn(2, 4, 7),
        torch.randn(1, 2, 4, 4, 4),
    ]
    for module, x in zip(modules, inputs, strict=True):
        ref_x = x.clone().requires_grad_()
        module(ref_x).square().sum().backward()
        ref_grads = [p.grad.clone() for p in module.parameters()]
        module.zero_grad()
        on = copy.deepcopy(module).to(dev(1))
        dx = x.to(dev(1)).requires_grad_()
        out = on(dx)
        assert out.device == dev(1), out.device
        out.square().sum().backward()
        assert dx.grad.device == dev(1) and torch.allclose(dx.grad.cpu(), ref_x.grad, atol=1e-4), module
        for p, g in zip(on.parameters(), ref_grads, strict=True):
            assert p.grad.device == dev(1) and torch.allclose(p.grad.cpu(), g, atol=1e-4), module
    raises(lambda: modules[1].to(dev(0))(inputs[1].to(dev(1))), RuntimeError, SAME)


def test_recurrent_cells_forward_and_backward_match_the_cpu() -> None:
    # torch sends a device's GRU and LSTM cells to _thnn_fused_gru_cell/_thnn_fused_lstm_cell,
    # which have kernels for CUDA only: nn.GRU, GRUCell, LSTM and LSTMCell failed on the emulator
    torch.manual_seed(0)
    cases = [
        (torch.nn.GRU(4, 6, num_layers=2, batch_first=True), torch.randn(2, 5, 4)),
        (torch.nn.GRUCell(4, 6), torch.randn(3, 4)),
        (torch.nn.LSTM(4, 6, bidirectional=True), torch.randn(5, 2, 4)),
        (torch.nn.LSTMCell(4, 6, bias=False), torch.randn(3, 4)),
    ]

    def loss(out):
        parts = out if isinstance(out, tuple) else (out,)
        flat = []
        for part in parts:
            flat.extend(part if isinstance(part, tuple) else (part,))
        return sum(t.square().sum() for t in flat)

    for module, x in cases:
        ref_x = x.clone().requires_grad_()
        loss(module(ref_x)).backward()
        ref_grads = [p.grad.clone() for p in module.parameters()]
        module.zero_grad()
        on = copy.deepcopy(module).to(dev(1))
        dx = x.to(dev(1)).requires_grad_()
        value = loss(on(dx))
        assert abs(value.item() - loss(module(x)).item()) < 1e-3, module
        value.backward()
        assert dx.grad.device == dev(1) and torch.allclose(dx.grad.cpu(), ref_x.grad, atol=1e-4), module
        for p, g in zip(on.parameters(), ref_grads, strict=True):
            assert torch.allclose(p.grad.cpu(), g, atol=1e-4), module


def test_indexing_with_host_and_device_indices() -> None:
    a = torch.arange(10.0, device="npu:1")
    assert a[3].item() == 3.0
    assert a[torch.tensor([1, 2])].tolist() == [1.0, 2.0]
    assert a[torch.tensor([0, 9], device="npu:1")].tolist() == [0.0, 9.0]
    assert a[a > 7].tolist() == [8.0, 9.0]
    a[torch.tensor([0])] = 5.0
    assert a[0].item() == 5.0
    assert torch.nonzero(a == 5.0).cpu().flatten().tolist() == [0, 5]


def test_save_and_load() -> None:
    sd = {"w0": torch.randn(3, 3, device=dev(0)), "w1": torch.randn(2, device=dev(1))}
    sd["view"] = sd["w0"][1]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert back["w0"].device == dev(0) and back["w1"].device == dev(1)
    assert torch.equal(back["w0"].cpu(), sd["w0"].cpu()) and torch.equal(back["w1"].cpu(), sd["w1"].cpu())
    assert back["view"].data_ptr() == back["w0"].data_ptr() + 3 * 4, "views stay views after load"
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["w1"].device.type == "cpu" and torch.equal(on_cpu["w1"], sd["w1"].cpu())
    buf.seek(0)
    moved = torch.load(buf, map_location="npu:1")
    assert {t.device for t in moved.values()} == {dev(1)}


def test_load_state_dict() -> None:
    src = torch.nn.Linear(4, 3)
    m = torch.nn.Linear(4, 3).to("npu:1")
    m.load_state_dict(src.state_dict())
    assert m.weight.device == dev(1) and torch.equal(m.weight.cpu(), src.weight.detach())
    meta = torch.nn.Linear(4, 3, device="meta")
    meta.load_state_dict({k: v.to("npu:0") for k, v in src.state_dict().items()}, assign=True)
    assert meta.weight.device == dev(0) and torch.equal(meta.bias.cpu(), src.bias.detach())
    host = torch.nn.Linear(4, 3)
    host.load_state_dict(m.state_dict())
    assert torch.equal(host.weight, src.weight)


def test_autograd_backward_on_device_1() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5)
    lin = copy.deepcopy(ref).to("npu:1")
    ref_loss = ref(x).relu().pow(2).mean()
    ref_loss.backward()
    loss = lin(x.to("npu:1")).relu().pow(2).mean()
    loss.backward()
    assert loss.device == dev(1) and lin.weight.grad.device == dev(1)
    assert torch.allclose(loss.cpu(), ref_loss.detach(), atol=1e-6)
    assert torch.allclose(lin.weight.grad.cpu(), ref.weight.grad, atol=1e-6)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    opt.step()
    ref_opt.step()
    assert torch.allclose(lin.weight.detach().cpu(), ref.weight.detach(), atol=1e-6)


def test_autograd_across_devices() -> None:
    a = torch.randn(8, 8, device="npu:0", requires_grad=True)
    b = (a * 2).to("npu:1")
    (b * b).sum().backward()
    assert a.grad.device == dev(0)
    assert torch.allclose(a.grad.cpu(), 8 * a.detach().cpu())


def test_mixed_devices_rejected() -> None:
    a = torch.ones(3, device="npu:0")
    b = torch.ones(3, device="npu:1")
    for fn in (
        lambda: a + b,
        lambda: torch.mm(a.view(3, 1), b.view(1, 3)),
        lambda: torch.cat([a, b]),
        lambda: torch.where(a > 0, a, b),
        lambda: a.copy_(b) if False else torch.stack([b, a]),
    ):
        msg = raises(fn, RuntimeError, SAME)
        assert "npu:0 and npu:1!" in msg or "npu:1 and npu:0!" in msg, msg
    raises(
        lambda: torch.index_select(b, 0, torch.tensor([0], device="npu:0")),
        RuntimeError,
        SAME + ", npu:1 and npu:0! (when checking argument for argument index in method "
        "wrapper_PrivateUse1__index_select)",
    )
    emb = torch.nn.Embedding(10, 4).to("npu:1")
    raises(lambda: emb(torch.tensor([1, 2], device="npu:0")), RuntimeError, SAME, "index_select")


def test_cpu_scalar_allowed_cpu_tensor_rejected() -> None:
    a = torch.ones(3, device="npu:1")
    assert (a + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]
    assert (a * torch.tensor(3)).device == dev(1)
    assert torch.where(a > 0, a, torch.tensor(0.0)).device == dev(1)
    raises(lambda: a + torch.ones(3), RuntimeError, SAME, "npu:1 and cpu!")
    raises(lambda: torch.mm(a.view(1, 3), torch.ones(3, 1)), RuntimeError, SAME, "cpu")


def test_allocation_past_capacity_raises_oom() -> None:
    base = torch.npu.memory_allocated(1)
    free, total = torch.npu.mem_get_info(1)
    assert total == 32 * MIB and free == total - base, (free, total, base)
    too_big = free + 1
    msg = raises(
        lambda: torch.empty(too_big, dtype=torch.uint8, device="npu:1"),
        torch.OutOfMemoryError,
        "NPU out of memory. Tried to allocate",
        "npu:1 has a total capacity of 32.00 MiB",
    )
    assert "is free" in msg
    assert issubclass(torch.OutOfMemoryError, RuntimeError)
    assert torch.npu.memory_allocated(1) == base, "a failed allocation must not be counted"
    x = torch.empty(too_big, dtype=torch.uint8, device="npu:0")  # budgets are per device
    del x
    # Growing a tensor past the budget fails the same way.
    y = torch.empty(1, dtype=torch.uint8, device="npu:1")
    raises(lambda: y.resize_(too_big), torch.OutOfMemoryError, "out of memory")


def test_freed_memory_is_returned() -> None:
    base = torch.npu.memory_allocated(1)
    x = torch.empty(10 * MIB, dtype=torch.uint8, device="npu:1")
    assert torch.npu.memory_allocated(1) == base + 10 * MIB
    assert torch.npu.mem_get_info(1)[0] == 32 * MIB - base - 10 * MIB
    assert torch.accelerator.memory_allocated(1) == base + 10 * MIB
    assert torch.npu.memory_stats(1)["allocated_bytes.all.current"] == base + 10 * MIB
    del x
    assert torch.npu.memory_allocated(1) == base
    assert torch.npu.max_memory_allocated(1) >= base + 10 * MIB
    torch.npu.reset_peak_memory_stats(1)
    assert torch.npu.max_memory_allocated(1) == base
    assert torch.npu.memory_reserved(1) == base
    torch.npu.empty_cache()
    # Fill the device in chunks until it refuses, free everything, and it all fits again.
    chunks = []
    try:
        while True:
            chunks.append(torch.empty(4 * MIB, dtype=torch.uint8, device="npu:1"))
    except torch.OutOfMemoryError:
        pass
    assert len(chunks) == (32 * MIB - base) // (4 * MIB), len(chunks)
    chunks.clear()
    again = [torch.empty(4 * MIB, dtype=torch.uint8, device="npu:1") for _ in range(7)]
    assert torch.npu.memory_allocated(1) == base + 28 * MIB
    del again


def test_per_process_memory_fraction() -> None:
    torch.npu.set_per_process_memory_fraction(0.5, 0)
    try:
        assert torch.npu.mem_get_info(0)[1] == 32 * MIB
        raises(lambda: torch.empty(40 * MIB, dtype=torch.uint8, device="npu:0"), torch.OutOfMemoryError)
    finally:
        torch.npu.set_per_process_memory_fraction(1.0, 0)
    assert torch.npu.mem_get_info(0)[1] == 64 * MIB


def test_device_selection_api() -> None:
    assert torch.npu.current_device() == 0
    torch.npu.set_device(1)
    assert torch.npu.current_device() == 1 and torch.empty(1, device="npu").device == dev(1)
    torch.npu.set_device("npu:0")
    with torch.npu.device(dev(1)):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    raises(lambda: torch.npu.set_device(2), RuntimeError, "Invalid device index 2")
    raises(lambda: torch.empty(1, device="npu:5"), RuntimeError, "Invalid device index 5")
    assert torch.device(0) == dev(0), "torch 2.13 maps a bare index to the current accelerator"
    assert torch.accelerator.current_accelerator() == torch.device("npu")
    assert torch.accelerator.device_count() == 2
    torch.npu.synchronize()
    torch.npu.synchronize(1)
    props = torch.npu.get_device_properties(1)
    assert props.total_memory == 32 * MIB and "NPU" in torch.npu.get_device_name(1)
    assert torch.npu.get_device_capability(0) == (props.major, props.minor)
    assert torch.npu.is_bf16_supported() and torch.npu.is_initialized()


def test_rng_api() -> None:
    torch.npu.manual_seed(3)
    a = torch.randn(5, device="npu:1")
    torch.npu.manual_seed_all(3)
    b = torch.randn(5, device="npu:1")
    assert torch.equal(a.cpu(), b.cpu())
    state = torch.npu.get_rng_state(1)
    c = torch.rand(3, device="npu:0")
    torch.npu.set_rng_state(state, 1)
    d = torch.rand(3, device="npu:0")
    assert torch.equal(c.cpu(), d.cpu())
    assert len(torch.npu.get_rng_state_all()) == 2 and torch.npu.initial_seed() == 3
    torch.npu.seed()
    with torch.random.fork_rng(device_type="npu"):
        torch.rand(1, device="npu:0")
    g = torch.Generator(device="npu")
    g.manual_seed(1)
    e = torch.randn(2, device="npu:0", generator=g)
    g.manual_seed(1)
    assert torch.equal(e.cpu(), torch.randn(2, device="npu:0", generator=g).cpu())


def test_streams_and_events() -> None:
    s = torch.npu.Stream()
    assert s.device == dev(0) and s.query()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
    assert torch.npu.current_stream() == torch.npu.default_stream()
    assert torch.npu.default_stream(1).device == dev(1)
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    torch.ones(100, device="npu:0").sum()
    end.record()
    end.synchronize()
    assert start.query() and start.elapsed_time(end) >= 0.0
    s1 = torch.npu.Stream(device=1)
    s1.wait_stream(s)
    s1.synchronize()
    assert s1.device == dev(1)
    torch.ones(2, device="npu:0").record_stream(s)


def test_generated_methods_and_pinned_memory() -> None:
    m = torch.nn.Linear(2, 2).npu(1)
    assert m.weight.device == dev(1) and m.weight.is_npu
    st = torch.ones(4).untyped_storage().npu(1)
    assert st.device == dev(1) and st.is_npu
    p = torch.ones(4).pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    assert torch.equal(p.to("npu:1", non_blocking=True).cpu(), torch.ones(4))


def test_the_host_allocator_is_registered() -> None:
    """torch.accelerator's host-cache calls find the runtime's host allocator (vLLM calls
    ``empty_host_cache()`` at shutdown on every platform but the CPU; without a registered host
    allocator the process died with a segmentation fault, where torch_npu has one)."""
    p = torch.ones(4).pin_memory()
    torch.accelerator.empty_host_cache()
    assert p.is_pinned() and torch.equal(p, torch.ones(4))


def test_autocast_and_grad_scaler() -> None:
    a = torch.ones(2, 2, device="npu:0")
    with torch.autocast("npu", dtype=torch.bfloat16):
        y = a @ a
        lin = torch.nn.functional.linear(a, a)
        soft = torch.softmax(a.to(torch.bfloat16), -1)  # a float32 op under autocast
        loss = torch.nn.functional.mse_loss(lin, a)
    assert y.device == dev(0) and y.dtype == lin.dtype == torch.bfloat16, (y.dtype, lin.dtype)
    assert soft.dtype == loss.dtype == torch.float32, (soft.dtype, loss.dtype)
    with torch.autocast("npu", dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    with torch.autocast("npu", dtype=torch.bfloat16, enabled=False):
        assert (a @ a).dtype == torch.float32
    assert (a @ a).dtype == torch.float32
    scaler = torch.npu.amp.GradScaler()
    w = torch.ones(2, device="npu:0", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale((w * 3).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.allclose(w.detach().cpu(), torch.full((2,), 0.7))


def test_only_own_shim_is_visible(torch_npu: ModuleType) -> None:
    spec = importlib.util.find_spec("torch_npu")
    assert spec is not None and os.sep + os.path.join("shims", "npu", "torch_npu") in spec.origin, spec
    for other in ("torch_mlu", "torch_musa", "torch_sdaa", "habana_frameworks"):
        assert importlib.util.find_spec(other) is None, other
    assert torch_npu.npu is torch.npu and "+accelreg.emu" in torch_npu.__version__
    from torch_npu.optim import NpuFusedAdamW

    assert issubclass(NpuFusedAdamW, torch.optim.AdamW)


def test_npu_fusion_attention_matches_sdpa(torch_npu: ModuleType) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 2, 8) for _ in range(3))  # BSND
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    mask = torch.triu(torch.ones(2048, 2048, device="npu:1"), diagonal=1).bool()
    out = torch_npu.npu_fusion_attention(
        q.to("npu:1"),
        k.to("npu:1"),
        v.to("npu:1"),
        2,
        "BSND",
        atten_mask=mask,
        scale=8**-0.5,
        keep_prob=1.0,
        sparse_mode=2,
    )[0]
    assert out.device == dev(1) and torch.allclose(out.cpu(), ref, atol=1e-5)
    x = torch.randn(1, 3, 1, 4)
    cos, sin = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
    rotated = torch.cat((-x[..., 2:], x[..., :2]), dim=-1)
    assert torch.allclose(torch_npu.npu_rotary_mul(x, cos, sin), x * cos + rotated * sin)
