"""``from_pretrained`` of a ~100M-parameter GPT-2 on the CPU, with and without accelreg.

    python benchmarks/bench_loader.py            # prints a Markdown table (a few minutes)

The model (random init, n_layer=8, n_embd=768, GPT-2's vocabulary: ~96M parameters, ~385 MB
of float32 safetensors) is saved once to a temporary directory. Each configuration is loaded
once to warm the page cache and the import-time caches, then ``device_map="auto"`` and
``device_map=None`` are loaded in alternation with and without ``accelreg.install()`` (enabled
and uninstalled in the same process, so both arms share one interpreter), and the median of
``--repeat`` loads is reported with the overhead ratio accelreg / stock.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])

import accelreg
import accelreg.integrations

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

MAPS = {'device_map="auto"': "auto", "device_map=None": None}


def save_model(path: str) -> int:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=8, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = GPT2LMHeadModel(cfg)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path, safe_serialization=True)
    del model
    gc.collect()
    return params


def load_seconds(path: str, device_map: object) -> tuple[float, set[str]]:
    gc.collect()
    t = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(path, device_map=device_map)
    elapsed = time.perf_counter() - t
    devices = {str(p.device) for p in model.parameters()}
    del model
    gc.collect()
    return elapsed, devices


def set_accelreg(on: bool) -> float:
    """Install or uninstall accelreg; returns how long that took (s)."""
    t = time.perf_counter()
    if on:
        accelreg.install()
    else:
        accelreg.integrations.uninstall()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="loads per configuration (median)")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()

    samples: dict[tuple[str, bool], list[float]] = {(m, on): [] for m in MAPS for on in (False, True)}
    toggles: dict[bool, list[float]] = {False: [], True: []}
    # libraries that log to stdout on first use (deepspeed's accelerator probe) go to stderr
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        path = os.path.join(tmp, "gpt2-100m")
        params = save_model(path)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        for label, device_map in MAPS.items():  # warm-up: page cache, lazy imports, both arms
            for on in (False, True):
                set_accelreg(on)
                _, devices = load_seconds(path, device_map)
                assert devices == {"cpu"}, (label, on, devices)
        set_accelreg(False)
        state = False
        for i in range(args.repeat):
            order = (False, True) if i % 2 == 0 else (True, False)  # alternate who goes first
            for on in order:
                if on != state:
                    toggles[on].append(set_accelreg(on))
                    state = on
                for label, device_map in MAPS.items():
                    seconds, _ = load_seconds(path, device_map)
                    samples[(label, on)].append(seconds)
        set_accelreg(False)

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(
        f"`from_pretrained` of a {params / 1e6:.0f}M-parameter GPT-2 ({size / 1e6:.0f} MB safetensors) on the "
        f"CPU, median of {args.repeat} alternating loads (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print()
    low = {k: min(v) for k, v in samples.items()}
    print(
        "| device_map | stock, median (s) | with `accelreg.install()`, median (s) | accelreg / stock "
        "| stock, min (s) | accelreg, min (s) | accelreg / stock (min) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in MAPS:
        stock, ours = med[(label, False)], med[(label, True)]
        lo_stock, lo_ours = low[(label, False)], low[(label, True)]
        print(
            f"| `{label}` | {stock:.3f} | {ours:.3f} | {ours / stock:.3f} "
            f"| {lo_stock:.3f} | {lo_ours:.3f} | {lo_ours / lo_stock:.3f} |"
        )
    print()
    print(
        f"- `accelreg.install()` with transformers/accelerate/peft already imported: "
        f"{statistics.median(toggles[True]) * 1e3:.1f} ms; `uninstall()`: "
        f"{statistics.median(toggles[False]) * 1e3:.1f} ms (medians)"
    )
    print()
    print("```json")
    print(
        json.dumps(
            {
                "parameters": params,
                "bytes": size,
                "samples_s": {f"{k[0]} accelreg={k[1]}": v for k, v in samples.items()},
                "install_s": toggles[True],
                "uninstall_s": toggles[False],
            },
            indent=1,
        )
    )
    print("```")


if __name__ == "__main__":
    main()
