"""resolve() on the cached path, import cost, and the first resolve in a fresh process.

    python benchmarks/bench_resolve.py            # prints a Markdown table

Baselines, measured in the same run: ``torch.device("cpu")`` and the hard-coded ladder from
seed 002 (transformers' ``_add_prefix_to_device`` as merged), reimplemented here with the same
cached ``is_*_available`` helpers accelerate uses, so the ladder is timed at its best.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _util import interleaved_ns

import accelreg
from accelreg.types import Availability, BackendSpec


class FakeCuda:
    """Two scripted CUDA devices, so that resolve(0) has an accelerator to resolve on."""

    @accelreg.hookimpl
    def accelreg_backends(self):
        yield BackendSpec("cuda", 100, lambda: Availability.yes("bench"), lambda: 2)


@functools.lru_cache
def _vendor(module: str) -> bool:
    if importlib.util.find_spec(f"torch_{module}") is None:
        return False
    return bool(getattr(torch, module).is_available())


def is_npu_available() -> bool:
    return _vendor("npu")


def is_mlu_available() -> bool:
    return _vendor("mlu")


def is_sdaa_available() -> bool:
    return _vendor("sdaa")


def is_musa_available() -> bool:
    return _vendor("musa")


@functools.lru_cache
def is_xpu_available() -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


@functools.lru_cache
def is_hpu_available() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None


def is_cuda_available() -> bool:
    return True  # the fake machine has CUDA; the real check would only be slower


def ladder(param_device):
    """Seed 002's ladder, as merged upstream (the baseline)."""
    if isinstance(param_device, int):
        if is_npu_available():
            device_type_str = "npu"
        elif is_cuda_available():
            device_type_str = "cuda"
        elif is_mlu_available():
            device_type_str = "mlu"
        elif is_xpu_available():
            device_type_str = "xpu"
        elif is_sdaa_available():
            device_type_str = "sdaa"
        elif is_musa_available():
            device_type_str = "musa"
        elif is_hpu_available():
            device_type_str = "hpu"
        else:
            raise ValueError(f"Invalid integer device_map {param_device}")
        return torch.device(f"{device_type_str}:{param_device}")
    return param_device


def _fresh(code: str, runs: int = 7) -> float:
    # Byte-code caching on, as on users' machines (this workplace sets PYTHONDONTWRITEBYTECODE,
    # which would add compile time to every import); one warm-up run writes the caches.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = []
    for _ in range(runs + 1):
        res = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        out.append(float(res.stdout.strip()))
    return statistics.median(out[1:])


IMPORT = (
    "import time, torch; t = time.perf_counter(); import accelreg; print((time.perf_counter() - t) * 1e3)"
)
FIRST = (
    "import time, torch, accelreg; t = time.perf_counter(); accelreg.resolve(); "
    "print((time.perf_counter() - t) * 1e3)"
)
NO_EP = (
    "import sys, torch, accelreg; import importlib.metadata as m; "
    "loaded = [n for n in sys.modules if n.startswith('accelreg.builtin') or n.startswith('accelreg.registry')]; "
    "print(len(loaded))"
)


def main() -> None:
    accelreg.register(FakeCuda(), "bench")
    assert accelreg.resolve(0) == torch.device("cuda", 0)
    accelreg.resolve("auto")
    ladder(0)
    ns = interleaved_ns(
        {
            "accelreg.resolve(0)": "resolve(0)",
            'accelreg.resolve("auto")': 'resolve("auto")',
            "accelreg.resolve()": "resolve()",
            'torch.device("cpu")': 'device("cpu")',
            "seed-002 ladder(0)": "ladder(0)",
        },
        {"resolve": accelreg.resolve, "device": torch.device, "ladder": ladder},
    )
    cpu = ns['torch.device("cpu")']
    rows = [(k, v, v / cpu) for k, v in ns.items()]
    import_ms = _fresh(IMPORT)
    first_ms = _fresh(FIRST)
    loaded = int(
        subprocess.run([sys.executable, "-c", NO_EP], capture_output=True, text=True, check=True).stdout
    )
    report = {
        "per_call_ns": ns,
        "import_accelreg_ms": import_ms,
        "first_resolve_ms": first_ms,
        "modules_loaded_at_import": loaded,
    }
    print('| call | median ns/call | x torch.device("cpu") |')
    print("| --- | ---: | ---: |")
    for name, value, ratio in rows:
        print(f"| `{name}` | {value:.0f} | {ratio:.2f} |")
    print()
    print(f"- `import accelreg` after `import torch`: {import_ms:.1f} ms (median of 7 fresh processes)")
    print(
        f"- first `resolve()` in a fresh process (entry-point scan + probes): {first_ms:.1f} ms (median of 7)"
    )
    print(f"- registry/backend modules loaded by `import accelreg`: {loaded}")
    print()
    print("```json")
    print(json.dumps(report, indent=1))
    print("```")


if __name__ == "__main__":
    main()
