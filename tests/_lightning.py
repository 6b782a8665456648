"""A tiny Lightning model and data for the Lightning tests (import after ``pytest.importorskip``).

``tiny(L)`` builds the module for either import name (``lightning`` or ``pytorch_lightning``):
the Trainer only accepts a LightningModule of its own package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

#: Quiet, short Trainer runs.
QUIET: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}


def data(n: int = 16, batch_size: int = 4) -> DataLoader:
    """``n`` fixed samples (4 features -> 1 target), in order."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


class _Tiny:
    """The model's body; :func:`tiny` mixes it into a LightningModule of the import name used."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 1)
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.a(x)
        self.seen.update(input=x.device, weight=self.a.weight.device, matmul=hidden.dtype)
        return self.b(torch.relu(hidden))

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.seen["loss"] = float(loss.detach())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny(L: Any) -> Any:
    """A two-layer regression LightningModule of ``L`` (``lightning`` or ``pytorch_lightning``)
    that records where its inputs, weights and matmul outputs were, and its last loss. Its class
    is a module attribute (``Tiny_lightning``), so ``ddp_spawn`` can pickle the model."""
    name = f"Tiny_{L.__name__}"
    cls = globals().get(name)
    if cls is None:
        cls = type(name, (_Tiny, L.LightningModule), {"__module__": __name__, "__qualname__": name})
        globals()[name] = cls
    return cls()


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's parameters, on the host."""
    return [p.detach().cpu().clone() for p in model.parameters()]


def run_script(
    tmp_path: Path, script: Path, args: list[str], env: dict[str, str], timeout: float
) -> dict[str, dict]:
    """Run a Lightning script (its ranks write ``<rank>.json`` into ``tmp_path``) in its own
    process group, killed when it is done however it ends (Lightning's children included);
    returns the ranks' records."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, output[-6000:]
    return {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}


def __getattr__(name: str) -> Any:
    """``Tiny_<import name>`` made on first use (unpickling a model in a spawned process)."""
    if name.startswith("Tiny_"):
        import importlib

        tiny(importlib.import_module(name.removeprefix("Tiny_")))
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
