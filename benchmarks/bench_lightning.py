"""Lightning training-step time: ``Trainer(accelerator=RegistryAccelerator("cpu"))`` vs
``Trainer(accelerator="cpu")``, paired.

    python benchmarks/bench_lightning.py                  # Markdown table (about a minute)
    python benchmarks/bench_lightning.py --rounds 11 --steps 60 --json out.json

The same model (a 3-layer MLP, 256 -> 512 -> 512 -> 256, batch 64, SGD), on the cpu, fitted by
two Trainers that differ only in the accelerator: accelreg's registry accelerator for the cpu
backend, and Lightning's own ``CPUAccelerator``. No ``install()``: the explicit accelerator alone
(a Trainer with ``install()`` on and ``accelerator="cpu"`` gets Lightning's own accelerator).
Each round fits both arms back to back (the order flips every round), ``--steps`` timed steps
after ``--warmup`` untimed ones; a step's time is the CPU time of the training thread between the
starts of consecutive training batches (loading the batch, the step, the optimizer, Lightning's
hooks: all of it runs in that thread with one torch thread and no loader workers). CPU time, not
wall time: on a machine shared with other work, wall time mostly measures the others. A row gives the
median over rounds of each arm's median step, and the median over rounds of the paired ratio
registry / Lightning (both arms of a round run back to back, so load from other processes hits
both alike). One torch thread, so the two arms do not compete for the cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
import warnings
from typing import Any


def _setup() -> tuple[Any, Any]:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(256, 512),
                torch.nn.ReLU(),
                torch.nn.Linear(512, 512),
                torch.nn.ReLU(),
                torch.nn.Linear(512, 256),
            )

        def training_step(self, batch: Any, index: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class StepTimes(L.Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.starts.append(time.thread_time())

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64 * 64, 256, generator=g), torch.randn(64 * 64, 256, generator=g))
    loader = DataLoader(data, batch_size=64, shuffle=False)
    return (L, MLP, StepTimes), loader


def _fit(parts: Any, loader: Any, accelerator: Any, warmup: int, steps: int) -> float:
    """One fit; the median of its timed step times, in ms."""
    L, MLP, StepTimes = parts
    timer = StepTimes()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=warmup + steps + 1,
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLP(), loader)
    starts = timer.starts[warmup:]
    return statistics.median(b - a for a, b in itertools.pairwise(starts)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    import lightning
    import torch

    from accelreg.integrations.lightning import RegistryAccelerator

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    parts, loader = _setup()
    arms = {"registry": lambda: RegistryAccelerator("cpu"), "lightning": lambda: "cpu"}
    times: dict[str, list[float]] = {name: [] for name in arms}
    ratios: list[float] = []
    _fit(parts, loader, "cpu", args.warmup, 5)  # imports and first-use costs out of the rounds
    for round_ in range(args.rounds):
        order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
        this = {name: _fit(parts, loader, arms[name](), args.warmup, args.steps) for name in order}
        for name, value in this.items():
            times[name].append(value)
        ratios.append(this["registry"] / this["lightning"])
    result = {
        "lightning": lightning.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rounds": args.rounds,
        "steps": args.steps,
        "registry_ms": statistics.median(times["registry"]),
        "lightning_ms": statistics.median(times["lightning"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(
        f"Lightning {result['lightning']}, torch {result['torch']}, 1 thread: median step (CPU time of the "
        f"training thread) over {args.rounds} paired rounds of {args.steps} steps"
    )
    print()
    print("| Trainer | median step (ms) | registry / Lightning (paired, median) | range over rounds |")
    print("| --- | ---: | ---: | --- |")
    print(f'| `accelerator="cpu"` (Lightning\'s CPUAccelerator) | {result["lightning_ms"]:.2f} | 1.000 | |')
    print(
        f'| `accelerator=RegistryAccelerator("cpu")` | {result["registry_ms"]:.2f} | {result["ratio"]:.3f} | '
        f"{result['ratio_min']:.3f}-{result['ratio_max']:.3f} |"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
