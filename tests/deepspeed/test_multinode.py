"""Two nodes x two ranks on localhost: two torchrun agents (``--nnodes 2``) joined by a c10d
rendezvous, on an emulated npu machine with four devices of distinct sizes. Node A's mask
(``ASCEND_RT_VISIBLE_DEVICES=0,1``) and node B's (``2,3``) with LOCAL_RANK give each rank its own
physical device, and a DeepSpeed all-reduce over the four ranks sums all of them.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.emu, pytest.mark.multinode]

GiB = 1 << 30


def test_two_nodes_each_rank_on_its_own_device_and_one_all_reduce(ds_helpers: Any) -> None:
    ranks = ds_helpers.two_nodes().ranks(4)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    physical = []
    for r in ranks:
        assert r["world_size"] == 4 and r["resolved"] == f"npu:{r['local_rank']}", r
        mask = r["visible"]
        assert mask in (["0", "1"], ["2", "3"]), r
        phys = int(mask[r["local_rank"]])
        assert r["capacity"] == (phys + 1) * GiB, f"rank {r['rank']} is not on physical device {phys}: {r}"
        physical.append(phys)
        # DeepSpeed's own npu class, handed over by accelreg, on the emulator's hccl backend
        assert r["accelerator"] == "NPU_Accelerator" and r["communication_backend"] == "hccl", r
        assert r["process_group_backend"] == "hccl", r
        assert r["collectives"]["all_reduce"] == [[10.0, 10.0, 10.0], r["resolved"]], r["collectives"]
    assert sorted(physical) == [0, 1, 2, 3], physical  # four ranks, four distinct physical devices
    assert {tuple(r["visible"]) for r in ranks} == {("0", "1"), ("2", "3")}  # two nodes
