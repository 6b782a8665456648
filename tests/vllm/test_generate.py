"""vLLM generates the same greedy tokens under the registry as stock vLLM on its CPU platform:
under ``accelreg run`` (no accelreg line in the script) on the cpu and on the emulated npu, and
after ``accelreg.install()`` with tensor parallelism over the emulated collectives.

Each test starts a vLLM engine in fresh processes (the script spawns vLLM's engine core and its
workers, and each of them chooses its platform): about half a minute to two minutes each on two
cores, so the group is ``slow`` and kept small. The reference is stock vLLM on its CPU platform,
in one process. They need vLLM: ``nox -s vllm`` runs them in its layer; elsewhere they skip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here (nox -s vllm runs these in its layer)", allow_module_level=True)

from accelreg.testing import clean_environ, emu_environ

from ._generate import MARK, build

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).with_name("_generate.py"))
#: What every run needs: no tokenizer download, workers' answers over vLLM's RPC (a callable).
_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The tiny Llama, saved once for the module."""
    path = str(tmp_path_factory.mktemp("vllm") / "tiny-llama")
    build(path)
    return path


def generate(model: str, env: dict[str, str], *args: str, run: bool = False) -> dict:
    """Run the script (under ``accelreg run`` with ``run``) and return its JSON line."""
    command = [sys.executable, SCRIPT, model, *args]
    if run:
        command = [sys.executable, "-m", "accelreg", "run", "--", *command]
    proc = subprocess.run(command, capture_output=True, text=True, env={**env, **_ENV}, timeout=900)
    assert proc.returncode == 0, (
        f"{' '.join(command)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARK)), None)
    assert line is not None, f"no result line\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[len(MARK) :])


@pytest.fixture(scope="module")
def stock(model) -> dict:
    """Stock vLLM on its CPU platform (no accelreg anywhere), engine core in this process."""
    return generate(model, clean_environ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}))


def test_stock_vllm_runs_on_its_cpu_platform(stock):
    assert stock["platform"] == "CpuPlatform" and stock["workers"] == [["CpuPlatform", "cpu"]]
    assert [len(t) for t in stock["tokens"]] == [8, 8, 8, 8]


def test_under_accelreg_run_on_the_cpu_the_tokens_are_stocks(model, stock):
    """Every process of the engine (this script, the engine core, its worker) asks the
    registry; with no accelerator it chooses vLLM's own CPU platform, and nothing changes."""
    got = generate(model, clean_environ(), run=True)
    assert got["platform"] == "CpuPlatform" and got["workers"] == [["CpuPlatform", "cpu"]]
    assert got["tokens"] == stock["tokens"]


def test_under_accelreg_run_on_the_emulated_npu_the_tokens_are_stocks(model, stock, emu_built):
    """The emulated npu has no vLLM platform of its own: the registry platform serves it, in
    the script's process and in the spawned engine core, on npu:0."""
    got = generate(model, emu_environ("npu", 2), run=True)
    assert got["platform"] == "RegistryNpuPlatform"
    assert got["workers"] == [["RegistryNpuPlatform", "npu:0"]]
    assert got["tokens"] == stock["tokens"]


def test_install_with_tensor_parallel_2_over_the_emulated_collectives(model, stock, emu_built):
    """``accelreg.install()`` in the script (no ``accelreg run``): the two spawned workers
    choose the registry platform too (the integration arms them), each on its own npu, and
    their all-reduces run on the emulator's collectives (``hccl`` under ``npu``)."""
    got = generate(model, emu_environ("npu", 2, VLLM_ENABLE_V1_MULTIPROCESSING="0"), "--tp", "2", "--install")
    assert got["platform"] == "RegistryNpuPlatform"
    assert got["workers"] == [["RegistryNpuPlatform", "npu:0"], ["RegistryNpuPlatform", "npu:1"]]
    assert got["tokens"] == stock["tokens"]
