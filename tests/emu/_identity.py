"""Parameter identity across ``module.to(device)``, as on CUDA and the vendors' runtimes: the
checks each emulated name runs in its own child (tests/emu/test_emu_core.py for npu,
test_emu_vendors.py for mlu/musa/sdaa/hpu, test_emu_config.py for emu)."""

from __future__ import annotations

import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        optimizer.step()


def module_to_keeps_parameters(device: torch.device) -> None:
    """``Module.to(device)`` and back keeps every Parameter object (and moves a gradient with
    it); an optimizer built *before* the move trains the moved parameters, to the values the
    same training on the cpu gives."""
    model = _model()
    before = list(model.parameters())
    model[0].weight.grad = torch.ones_like(model[0].weight)
    model.to(device)
    after = list(model.parameters())
    assert all(a is b for a, b in zip(before, after, strict=True)), "module.to(device) made new Parameters"
    assert all(type(p) is torch.nn.Parameter and p.device == device for p in after), after
    assert model[0].weight.grad.device == device and model[0].weight.grad.sum().item() == 32.0
    model.to("cpu")
    assert all(a is b and a.device.type == "cpu" for a, b in zip(before, model.parameters(), strict=True))

    reference = _model()
    _steps(reference, torch.optim.Adam(reference.parameters(), lr=0.1), torch.device("cpu"))
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # built first, as users do
    model.to(device)
    _steps(model, optimizer, device)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert got.device == device and torch.allclose(got.detach().cpu(), want.detach(), atol=1e-6), (
            "the optimizer built before the move did not train the moved parameters"
        )
    assert all(s["exp_avg"].device == device for s in optimizer.state.values())


def opt_out_makes_new_parameters(device: torch.device) -> None:
    """``set_shallow_copy_compatible(False)`` (what ``ACCELREG_EMU_SHALLOW_COPY=0`` sets at
    activation) is a PrivateUse1 runtime without the override: new Parameters, as torch decides."""
    ops = torch.ops.accelreg_emu
    assert ops.shallow_copy_compatible()
    ops.set_shallow_copy_compatible(False)
    try:
        assert not torch._has_compatible_shallow_copy_type(torch.empty(0), torch.empty(0, device=device))
        model = _model()
        before = list(model.parameters())
        model.to(device)
        assert not any(a is b for a, b in zip(before, model.parameters(), strict=True))
    finally:
        ops.set_shallow_copy_compatible(True)
    assert torch._has_compatible_shallow_copy_type(torch.empty(0), torch.empty(0, device=device))
