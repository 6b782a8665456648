"""Vendor parity under a launcher (issues 36 and 42): the Trainer with a DeepSpeed config, two ranks under
``accelreg run -- torchrun`` and ``accelreg run -- deepspeed``, on a device type no host library
knows (``emu``) and under every other name the emulator presents, with identical results.

The script (``_parity_launch.py``) has no accelreg line: ``accelreg run`` arms every process it
starts. Each rank records TrainingArguments' device, ``n_gpu``, parallel mode and distributed
type, the model's device, the losses, the weights and its checkpoint's random-state keys. All of
it must equal emu's under torchrun, rank by rank (devices written as ``<device>:<rank>``). The
jobs start together (launchers and two ranks each): slow.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from accelreg.testing import emu_environ

from ..deepspeed._harness import free_port
from ..deepspeed.test_launcher import Job, run_jobs

pytestmark = [pytest.mark.emu, pytest.mark.slow]

pytest.importorskip("deepspeed", reason="DeepSpeed is in the [deepspeed] extra")

SCRIPT = str(Path(__file__).with_name("_parity_launch.py"))
NAMES = ("emu", "npu", "mlu", "musa", "hpu", "sdaa")
TIMEOUT = 560


def _run() -> list[str]:
    return [sys.executable, "-m", "accelreg", "run", "--"]


def _torchrun() -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]


def _deepspeed() -> list[str]:
    script = Path(sys.executable).with_name("deepspeed")
    base = [str(script)] if script.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return [*base, "--master_port", str(free_port())]


def _environ(name: str) -> dict[str, str]:
    env = emu_environ(name, 2)
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", ACCELREG_PROBE_TIMEOUT="900")
    return env


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("parity-launch")
    spec = {
        name: ([*_run(), *_torchrun(), SCRIPT, str(root / name)], _environ(name), root / name)
        for name in NAMES
    }
    spec["emu-deepspeed"] = (
        [*_run(), *_deepspeed(), SCRIPT, str(root / "emu-deepspeed")],
        _environ("emu"),
        root / "emu-deepspeed",
    )
    return run_jobs(spec, timeout=TIMEOUT)


def test_a_vendor_only_backend_trains_with_deepspeed_under_torchrun(jobs: dict[str, Job]) -> None:
    for r, rank in enumerate(jobs["emu"].ranks(2)):
        assert rank["device"] == rank["model_device"] == f"<device>:{r}", rank
        assert rank["n_gpu"] == 1 and rank["parallel_mode"] == "ParallelMode.DISTRIBUTED", rank
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["deepspeed"] is True, rank
        assert rank["rng_keys"] == ["<device>", "cpu", "numpy", "python"], rank
        assert len(rank["losses"]) == 3, rank


def test_deepspeeds_launcher_gives_what_torchrun_gives(jobs: dict[str, Job]) -> None:
    assert jobs["emu-deepspeed"].ranks(2) == jobs["emu"].ranks(2)


@pytest.mark.parametrize("name", NAMES[1:])
def test_every_name_trains_as_emu_does(jobs: dict[str, Job], name: str) -> None:
    reference, got = copy.deepcopy(jobs["emu"].ranks(2)), copy.deepcopy(jobs[name].ranks(2))  # shared records
    if name == "hpu":  # a runtime that addresses its devices without an index: TrainingArguments'
        for rank in got:  # device is "hpu", the rank's model on hpu:<rank> all the same
            assert rank.pop("device") == "<device>", rank
        for rank in reference:
            rank.pop("device")
    assert got == reference
