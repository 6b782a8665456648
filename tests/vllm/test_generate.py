"""vLLM generates the same greedy tokens under the registry as stock vLLM on its CPU platform:
under ``accelreg run`` (no accelreg line in the script) on the cpu and on the emulated npu, and
after ``accelreg.install()`` with tensor parallelism over the emulated collectives.

Each test reads a vLLM engine's run in fresh processes (the script spawns vLLM's engine core and
its workers, and each of them chooses its platform); the four runs start together when the module
starts (two to three minutes on two cores), so the group is ``slow`` and kept small. The
reference is stock vLLM on its CPU platform, in one process. They need vLLM: ``nox -s vllm`` runs
them in its layer; elsewhere they skip.
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


#: The runs, by name: (the script's arguments, the environment, under ``accelreg run``). Stock
#: vLLM runs its engine core in the script's process; the others spawn theirs, as users' do.
RUNS = {
    "stock": ((), clean_environ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}), False),
    "cpu": ((), clean_environ(), True),
    "npu": ((), emu_environ("npu", 2), True),
    "npu-tp2": (("--tp", "2", "--install"), emu_environ("npu", 2, VLLM_ENABLE_V1_MULTIPROCESSING="0"), False),
}


@pytest.fixture(scope="module")
def runs(model, emu_built):
    """Every run started at once when the module starts (each is mostly single-threaded
    imports: two cores run two at a time), its result read when a test asks for it."""
    procs = {}
    for name, (args, env, run) in RUNS.items():
        command = [sys.executable, SCRIPT, model, *args]
        if run:
            command = [sys.executable, "-m", "accelreg", "run", "--", *command]
        procs[name] = (
            command,
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **_ENV}
            ),
        )
    results = {}

    def result(name: str) -> dict:
        if name not in results:
            command, proc = procs[name]
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, (
                f"{' '.join(command)} exited {proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
            )
            line = next((x for x in out.splitlines() if x.startswith(MARK)), None)
            assert line is not None, f"no result line\n{out[-3000:]}\n{err[-3000:]}"
            results[name] = json.loads(line[len(MARK) :])
        return results[name]

    yield result
    for _, proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def stock(runs) -> dict:
    """Stock vLLM on its CPU platform (no accelreg anywhere), engine core in the script's process."""
    return runs("stock")


def test_stock_vllm_runs_on_its_cpu_platform(stock):
    assert stock["platform"] == "CpuPlatform" and stock["workers"] == [["CpuPlatform", "cpu"]]
    assert [len(t) for t in stock["tokens"]] == [8, 8, 8, 8]


def test_under_accelreg_run_on_the_cpu_the_tokens_are_stocks(runs, stock):
    """Every process of the engine (this script, the engine core, its worker) asks the
    registry; with no accelerator it chooses vLLM's own CPU platform, and nothing changes."""
    got = runs("cpu")
    assert got["platform"] == "CpuPlatform" and got["workers"] == [["CpuPlatform", "cpu"]]
    assert got["tokens"] == stock["tokens"]


def test_under_accelreg_run_on_the_emulated_npu_the_tokens_are_stocks(runs, stock):
    """The emulated npu has no vLLM platform of its own: the registry platform serves it, in
    the script's process and in the spawned engine core, on npu:0."""
    got = runs("npu")
    assert got["platform"] == "RegistryNpuPlatform"
    assert got["workers"] == [["RegistryNpuPlatform", "npu:0"]]
    assert got["tokens"] == stock["tokens"]


def test_install_with_tensor_parallel_2_over_the_emulated_collectives(runs, stock):
    """``accelreg.install()`` in the script (no ``accelreg run``): the two spawned workers
    choose the registry platform too (the integration arms them), each on its own npu, and
    their all-reduces run on the emulator's collectives (``hccl`` under ``npu``)."""
    got = runs("npu-tp2")
    assert got["platform"] == "RegistryNpuPlatform"
    assert got["workers"] == [["RegistryNpuPlatform", "npu:0"], ["RegistryNpuPlatform", "npu:1"]]
    assert got["tokens"] == stock["tokens"]
