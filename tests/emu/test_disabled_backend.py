"""A backend disabled in accelreg is never used by any rank of any launcher (issue 28).

The machine has the emulated npu (2 devices; ``torch_npu`` importable, as on an Ascend node) and
the user turned it off in accelreg: ``ACCELREG_DISABLE=npu``. Each library would find the npu
runtime by itself (accelerate's ``is_npu_available()``, DeepSpeed's own detection,
``torch.accelerator``). Under ``accelreg run``, with no accelreg line in the script
(``_disabled_rank.py``): two torchrun ranks, two ranks of DeepSpeed's launcher and two processes
of Fabric's own launcher each ask torch.accelerator, ``accelreg.resolve()``, DeepSpeed's
accelerator, Lightning's ``accelerator="auto"`` (accelerate's ``PartialState`` in the torchrun
ranks) and Ray's NPU resource count: all cpu, none, or 0. accelerate's own launcher with npu
disabled is in test_accelerate_launch.py, a Ray node and its tasks in test_ray.py
(``TestRayWithNpuDisabledInAccelreg``). The jobs run at once, each in its own process group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accelreg.testing import emu_environ

from ..deepspeed._harness import free_port
from ..deepspeed.test_launcher import Job, run_jobs

pytestmark = [pytest.mark.slow, pytest.mark.emu]

for _name in ("deepspeed", "lightning", "accelerate", "ray"):
    pytest.importorskip(_name, reason=f"{_name} is in the [test] extra")

RANK = str(Path(__file__).with_name("_disabled_rank.py"))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("disabled")
    env = emu_environ("npu", 2, ACCELREG_DISABLE="npu", OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
    env["ACCELREG_PROBE_TIMEOUT"] = "900"  # a loaded machine: the timeout is for hung drivers
    run = [sys.executable, "-m", "accelreg", "run", "--"]
    deepspeed = Path(sys.executable).with_name("deepspeed")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    spec = {
        "torchrun": [*torchrun, "--master-port", str(free_port()), RANK],
        "deepspeed": [str(deepspeed), "--num_gpus", "2", "--master_port", str(free_port()), RANK],
        "lightning": [sys.executable, RANK],
    }
    return run_jobs(
        {
            mode: ([*run, *argv, str(root / mode), mode], dict(env), root / mode)
            for mode, argv in spec.items()
        },
        timeout=400,
    )


@pytest.mark.parametrize("mode", ["torchrun", "deepspeed", "lightning"])
def test_no_rank_uses_the_disabled_backend(jobs: dict[str, Job], mode: str) -> None:
    for rank in jobs[mode].ranks(2):
        assert rank["runtime_present"], "the npu runtime must be there for the test to mean anything"
        assert rank["torch_accelerator"] == "None" and rank["torch_device_count"] == 0, rank
        assert rank["resolve"] == "cpu" and rank["deepspeed"] == "cpu" and rank["ray_npu"] == 0, rank
        assert rank["lightning"] == "CPUAccelerator" and rank["device"] == "cpu", rank
        assert rank["npu_mask"] is None, rank  # no launcher masked npu devices in
        if mode == "torchrun":
            assert rank["accelerate"].startswith("cpu") and rank["accelerate_type"] == "MULTI_CPU", rank


def test_deepspeeds_launcher_lists_no_device_of_another_backend_in_the_ranks(jobs: dict[str, Job]) -> None:
    """DeepSpeed's cpu accelerator masks its ranks with ``CUDA_VISIBLE_DEVICES=<slots>``, which
    would make cuda look present (and failing) to every rank; accelreg hands it a cpu
    accelerator that sets that variable to ``""`` (no device) instead."""
    for rank in jobs["deepspeed"].ranks(2):
        assert rank["cuda_mask"] in (None, ""), rank
