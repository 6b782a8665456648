"""DeepSpeed ZeRO 0-3 on backends DeepSpeed has no class for: the emulator as ``musa`` and under
its own name ``emu``, with 1 and 2 ranks (``_zero.py``; one rank alone, two under torchrun).

Each rank trains on its own emulated device through the accelerator accelreg hands DeepSpeed,
with collectives on the emulator's ``torch.distributed`` backend, and its losses match the same
training done in plain torch on the cpu within float tolerance.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from .conftest import STAGES

pytestmark = [pytest.mark.slow, pytest.mark.emu]

BACKENDS = {"musa": "mccl", "emu": "emuccl"}  # backend -> the collective backend its plugin declares
RANKS = (1, 2)


@pytest.mark.parametrize("nproc", RANKS)
@pytest.mark.parametrize("name", BACKENDS)
def test_deepspeed_runs_on_the_registrys_accelerator(ds_helpers: Any, name: str, nproc: int) -> None:
    for r in ds_helpers.zero(name, nproc).ranks(nproc):
        assert r["backend"] == name and r["resolved"] == f"{name}:{r['local_rank']}", r
        assert r["accelerator"] == "RegistryAccelerator" and r["accelerator_name"] == name, r
        assert r["accelerator_devices"] == 2 and r["world_size"] == nproc, r
        assert r["communication_backend"] == r["dist_backend"] == BACKENDS[name], r
        assert r["process_group_backend"] == BACKENDS[name], r
        report = r["report"]
        assert report["implementation"] == "accelreg's registry accelerator" and report["agree"], report
        assert report["how"] == f"handed over by accelreg (the registry chose {name})", report


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("nproc", RANKS)
@pytest.mark.parametrize("name", BACKENDS)
def test_zero_stage_trains_like_the_cpu(ds_helpers: Any, name: str, nproc: int, stage: int) -> None:
    for r in ds_helpers.zero(name, nproc).ranks(nproc):
        result = r["stages"][str(stage)]
        assert "error" not in result, result.get("error")
        device = f"{name}:{r['local_rank']}"
        assert result["engine_device"] == device and result["param_devices"] == [device], result
        losses, reference = result["losses"], r["cpu_reference"]
        assert len(losses) == len(reference) == 3 and len(set(reference)) == 3, (losses, reference)
        for got, want in zip(losses, reference, strict=True):
            assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6), (stage, losses, reference)


@pytest.mark.parametrize("name", BACKENDS)
def test_collectives_on_emulated_devices(ds_helpers: Any, name: str) -> None:
    ranks = ds_helpers.zero(name, 2).ranks(2)
    for r in ranks:
        c, rank = r["collectives"], r["rank"]
        assert c["all_reduce"] == [[3.0, 3.0, 3.0], f"{name}:{r['local_rank']}"], c  # DeepSpeed's all_reduce
        assert c["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0] and c["all_gather"] == [0.0, 10.0], c
        assert c["all_gather_into_grad_buffer"] == [0.0, 0.0, 1.0, 1.0], c
        assert c["reduce_scatter_tensor"] == [4.0 * rank, 4.0 * rank + 2.0], c  # sum of [0, 1, 2, 3] twice
        assert c["reduce_scatter"] == [2.0 * (rank + 1)], c
        assert c["broadcast"] == [1.0, 1.0] and c["barrier"] is True, c
