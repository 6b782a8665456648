"""DeepSpeed engine step time: accelreg's registry accelerator vs DeepSpeed's own npu class.

    python benchmarks/bench_deepspeed.py                 # prints a Markdown table (a few minutes)
    python benchmarks/bench_deepspeed.py --rounds 9 --steps 10 --stages 0 3

Runs itself on the emulated npu (``ACCELREG_EMU_NAME=npu``, one process, one rank). For each
ZeRO stage, two engines are built from the same tiny Llama on ``npu:0``: one under DeepSpeed's
``NPU_Accelerator`` (what DeepSpeed picks there by itself, and what accelreg hands it for npu)
and one under :func:`accelreg.integrations.deepspeed.registry_accelerator` (what accelreg hands
DeepSpeed for a backend it has no class for). The two are stepped in alternation — before each
arm DeepSpeed's global accelerator is set to that arm's — ``--steps`` steps per turn for
``--rounds`` turns (the order flips every turn); each row gives the median over turns of the mean
step time, and the median over turns of the paired ratio registry / NPU class (the two arms of
one turn run back to back, so load from other processes hits both alike). Emulated kernels run
synchronously on the host, so the step time is DeepSpeed's and the model's work, and what
differs between the arms is only the accelerator's own overhead.

A second table times, per call and interleaved, the accelerator methods a ZeRO-3 step calls most
(counted once per step on this model; ``CALLS``), and multiplies the difference by the count: the
registry accelerator's overhead per step, with little noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: Accelerator methods a ZeRO-3 step of the benchmark model calls, and how often (counted with a
#: wrapper around every method of the registry accelerator, 5 steps, DeepSpeed 0.19.8).
CALLS = {
    "range_push('x')": 573,
    "range_pop()": 573,
    "is_synchronized_device()": 172,
    "current_stream()": 169,
    "resolves_data_dependency()": 86,
    "device_name()": 51,
    "stream(s)": 44,
    "on_accelerator(t)": 42,
    "handles_memory_backpressure()": 22,
    "current_device_name()": 21,
    "synchronize()": 2,
}


def _reexec(argv: list[str]) -> int:
    env = dict(os.environ)
    env.update(
        ACCELREG_EMU_NAME="npu",
        ACCELREG_EMU_DEVICES="2",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=env.get("MASTER_PORT", "29641"),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_OFFLINE="1",
    )
    return subprocess.call([sys.executable, __file__, *argv], env=env)


def _engine(stage: int, accelerator: Any) -> Any:
    import deepspeed
    import torch
    from deepspeed.accelerator import real_accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    real_accelerator.set_accelerator(accelerator)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).to("npu:0")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def _steps(engine: Any, accelerator: Any, n: int, batch: Any) -> float:
    from deepspeed.accelerator import real_accelerator

    real_accelerator.set_accelerator(accelerator)
    t = time.perf_counter()
    for _ in range(n):
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
    accelerator.synchronize()
    return (time.perf_counter() - t) / n


def _per_call(arms: dict[str, Any], tensor: Any) -> list[dict[str, Any]]:
    from _util import interleaved_ns

    names = list(arms)
    out = []
    for call, count in CALLS.items():
        namespace = {"s": arms[names[0]].current_stream(), "t": tensor}
        namespace.update({f"a{i}": arms[n] for i, n in enumerate(names)})
        ns = interleaved_ns(
            {n: f"a{i}.{call}" for i, n in enumerate(names)}, namespace, number=20_000, repeat=7
        )
        out.append({"call": call, "per_step": count, **{n: ns[n] for n in names}})
    return out


def measure(stages: list[int], rounds: int, steps: int) -> dict[str, Any]:
    import importlib

    import torch
    import torch_npu  # noqa: F401 - brings the emulated npu up
    from deepspeed.accelerator.npu_accelerator import NPU_Accelerator

    from accelreg.integrations.deepspeed import registry_accelerator

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    arms = {
        "DeepSpeed NPU_Accelerator": NPU_Accelerator(),
        "accelreg registry accelerator": registry_accelerator(),
    }
    batch = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1)).to("npu:0")
    rows = []
    for stage in stages:
        engines = {name: _engine(stage, acc) for name, acc in arms.items()}
        for name, acc in arms.items():  # warm-up
            _steps(engines[name], acc, 2, batch)
        samples: dict[str, list[float]] = {name: [] for name in arms}
        for r in range(rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in order:
                samples[name].append(_steps(engines[name], arms[name], steps, batch))
        base = samples["DeepSpeed NPU_Accelerator"]
        for name, values in samples.items():
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            rows.append(
                {
                    "stage": stage,
                    "arm": name,
                    "ms_per_step": statistics.median(values) * 1e3,
                    "ratio": statistics.median(ratios),
                    "ratio_range": [min(ratios), max(ratios)],
                }
            )
        for engine in engines.values():
            engine.destroy()
    per_call = _per_call(arms, batch)
    return {
        "rows": rows,
        "per_call": per_call,
        "rounds": rounds,
        "steps": steps,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--stages", type=int, nargs="*", default=[0, 3])
    ap.add_argument("--json", action="store_true", help="print the raw record instead of a table")
    args = ap.parse_args(argv)
    if os.environ.get("ACCELREG_EMU_NAME") != "npu":
        return _reexec(sys.argv[1:] if argv is None else argv)
    warnings.filterwarnings("ignore")
    from deepspeed.utils import logger

    logger.setLevel("ERROR")
    record = measure(args.stages, args.rounds, args.steps)
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    print(
        f"DeepSpeed engine step on the emulated npu, one rank, median of {record['rounds']} alternating turns "
        f"of {record['steps']} steps (torch {record['torch']}, {record['threads']} thread(s))\n"
    )
    print("| ZeRO stage | accelerator | ms / step | x NPU_Accelerator (paired; min-max) |")
    print("| ---: | --- | ---: | ---: |")
    for row in record["rows"]:
        low, high = row["ratio_range"]
        print(
            f"| {row['stage']} | {row['arm']} | {row['ms_per_step']:.1f} | "
            f"{row['ratio']:.3f} ({low:.2f}-{high:.2f}) |"
        )
    names = ["DeepSpeed NPU_Accelerator", "accelreg registry accelerator"]
    print(
        "\nPer call (ns, median of 7 interleaved runs), and the difference times the calls per ZeRO-3 step:\n"
    )
    print("| call | per step | NPU_Accelerator | registry | difference x calls (us/step) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    total = 0.0
    for row in record["per_call"]:
        extra = (row[names[1]] - row[names[0]]) * row["per_step"] / 1e3
        total += extra
        print(
            f"| `{row['call']}` | {row['per_step']} | {row[names[0]]:.0f} | {row[names[1]]:.0f} | {extra:+.1f} |"
        )
    print(f"| total | | | | {total:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
