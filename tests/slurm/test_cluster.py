"""Slurm on a real one-node cluster (Debian's slurm-wlm; ``_cluster.py``), on the emulated npu.

The node declares the emulator's two devices twice, as Slurm's ``gpu`` type (what sites that
want Slurm's bookkeeping do) and as a custom ``npu`` type (``Gres=gpu:2,npu:2``). The physical
devices have distinct sizes (1 GiB and 2 GiB), so a task's capacity says which one it runs on.
Each test starts real ``srun``/``sbatch`` jobs, every client under a timeout; the cluster is one
per session and its daemons are stopped by their process ids, also when a test fails.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ._cluster import Cluster, physical, records

pytestmark = pytest.mark.slow

PROBE = str(Path(__file__).with_name("_probe.py"))
RUN = ["accelreg", "run", "--"]
STEP_TIMEOUT = 300.0


def _results(tmp_path: Path, name: str = "results") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def _step(cluster: Cluster, folder: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``srun ARGS``; the client's output (the test checks the exit status itself)."""
    proc = cluster.run("srun", *args, timeout=STEP_TIMEOUT, env={"PROBE_RESULTS": str(folder), **(env or {})})
    return f"srun exit status {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


def _own_devices(rows: list[dict], n: int = 2) -> None:
    """Task r runs on npu:r, physical device r."""
    assert [r["task"] for r in rows] == [str(i) for i in range(n)], rows
    for i, row in enumerate(rows):
        assert "error" not in row, row
        assert row["device"] == f"npu:{i}" and physical(row) == i, row


def test_each_task_gets_its_own_device_without_a_line_of_slurm_code(slurm_cluster, tmp_path):
    """``srun -n2 accelreg run -- python probe.py``: the script reads ``LOCAL_RANK`` and uses
    torch's own npu API; accelreg run supplies the ranks and the mask from Slurm."""
    out = _results(tmp_path)
    log = _step(slurm_cluster, out, "-n2", "--gres=npu:2", *RUN, sys.executable, PROBE, "plain")
    rows = records(out)
    assert "exit status 0" in log, log
    _own_devices(rows)
    for i, row in enumerate(rows):
        assert (row["RANK"], row["WORLD_SIZE"], row["LOCAL_RANK"]) == (str(i), "2", str(i)), row
        assert row["MASTER_ADDR"] == "localhost" and row["MASTER_PORT"] == rows[0]["MASTER_PORT"], row
        assert row["ASCEND_RT_VISIBLE_DEVICES"] == "0,1", row  # Slurm's npu:2 (IDX:0-1)


def test_a_script_calling_resolve_gets_its_tasks_device_under_plain_srun(slurm_cluster, tmp_path):
    """``srun -n2 python probe.py`` (no wrapper): ``resolve()`` reads Slurm's local rank."""
    out = _results(tmp_path)
    log = _step(slurm_cluster, out, "-n2", sys.executable, PROBE, "resolve")
    assert "exit status 0" in log, log
    rows = records(out)
    _own_devices(rows)
    assert all(r["RANK"] is None and r["ASCEND_RT_VISIBLE_DEVICES"] is None for r in rows), rows


def test_two_tasks_all_reduce_over_the_backends_collectives(slurm_cluster, tmp_path):
    """A 2-task all-reduce over ``accelreg.dist_backend()``, initialised from the environment
    ``accelreg run`` gives each task (MASTER_ADDR/PORT, RANK, WORLD_SIZE)."""
    out = _results(tmp_path)
    log = _step(slurm_cluster, out, "-n2", "--gres=npu:2", *RUN, sys.executable, PROBE, "allreduce")
    assert "exit status 0" in log, log
    rows = records(out)
    _own_devices(rows)
    for row in rows:
        assert (row["all_reduce"], row["world"], row["dist_backend"]) == (12.0, 2, "hccl"), row


def test_gpus_per_task_gives_each_task_its_own_device(slurm_cluster, tmp_path):
    """``--gpus-per-task=1`` on gpu-typed GRES: Slurm binds one device to each task
    (``SLURM_STEP_GPUS``, per task); each sees one device, the one Slurm chose."""
    out = _results(tmp_path)
    log = _step(slurm_cluster, out, "-n2", "--gpus-per-task=1", *RUN, sys.executable, PROBE, "resolve")
    assert "exit status 0" in log, log
    rows = records(out)
    assert [r["task"] for r in rows] == ["0", "1"], rows
    assert sorted(physical(r) for r in rows) == [0, 1], rows
    for row in rows:
        assert row["device"] == "npu:0" and row["count"] == 1, row  # its own device, whatever its rank
        assert row["ASCEND_RT_VISIBLE_DEVICES"] == str(physical(row)), row
        assert f"npu={physical(row)}" in row["ACCELREG_DEVICE_ID"].split(","), row


@pytest.mark.parametrize("request_one", ["--gpus-per-task=1", "--gres=npu:1"])
def test_two_concurrent_jobs_land_on_the_devices_slurm_gave_them(slurm_cluster, tmp_path, request_one):
    """Two jobs at once, one device each: one under ``accelreg run``, the other with the start-up
    hook alone (``ACCELREG_AUTO_INSTALL=1``); each runs on the device Slurm allocated to it, so
    they never share one."""
    out = _results(tmp_path)
    hold = tmp_path / "release"
    env = {"PROBE_RESULTS": str(out), "PROBE_HOLD": str(hold)}
    jobs = [
        slurm_cluster.popen("srun", "-n1", request_one, *RUN, sys.executable, PROBE, "resolve", env=env),
        slurm_cluster.popen(
            "srun",
            "-n1",
            request_one,
            sys.executable,
            PROBE,
            "resolve",
            env={**env, "ACCELREG_AUTO_INSTALL": "1"},
        ),
    ]
    try:
        deadline = time.monotonic() + STEP_TIMEOUT
        while len(list(out.glob("*.json"))) < 2 and time.monotonic() < deadline:
            assert all(j.poll() is None for j in jobs), [j.communicate() for j in jobs]
            time.sleep(0.2)
        rows = records(out)  # both hold their device now: the jobs overlap in time
    finally:
        hold.touch()
        logs = []
        for job in jobs:
            try:
                logs.append(job.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                job.kill()  # the srun client this test started, by its handle
                logs.append(job.communicate()[0])
    assert len(rows) == 2 and rows[0]["job"] != rows[1]["job"], (rows, logs)
    assert sorted(physical(r) for r in rows) == [0, 1], (rows, logs)
    for row in rows:
        assert "error" not in row and row["device"] == "npu:0" and row["count"] == 1, row
        assert row["ASCEND_RT_VISIBLE_DEVICES"] == str(physical(row)), row
        assert row["ACCELREG_SLURM_TASK"] == f"{row['job']}.0.0", row
    assert all(job.returncode == 0 for job in jobs), logs


def test_a_task_past_the_allocated_devices_gets_a_device_error(slurm_cluster, tmp_path):
    """Two tasks, one npu for the job on the node: task 1 has no device of its own, and says
    so, instead of sharing device 0."""
    out = _results(tmp_path)
    log = _step(slurm_cluster, out, "-n2", "--gres=npu:1", *RUN, sys.executable, PROBE, "resolve")
    assert "exit status 0" not in log, log
    first, second = records(out)
    assert first["device"] == "npu:0" and physical(first) == int(first["ASCEND_RT_VISIBLE_DEVICES"]), first
    assert second["error"].startswith("DeviceError: LOCAL_RANK=1, but npu has 1 device (npu:0)"), second
    assert "ASCEND_RT_VISIBLE_DEVICES" in second["error"], second


def test_sbatch_with_srun_inside_works_the_same(slurm_cluster, tmp_path):
    """A batch script (its shell is no task) whose ``srun`` starts the tasks."""
    out = _results(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun accelreg run -- {sys.executable} {PROBE} resolve\n")
    proc = slurm_cluster.run(
        "sbatch", "--wait", "-n2", "--gres=npu:2", "-o", str(tmp_path / "job.out"), str(script),
        timeout=STEP_TIMEOUT, env={"PROBE_RESULTS": str(out)},
    )  # fmt: skip
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, (proc.stdout, proc.stderr, log)
    rows = records(out)
    _own_devices(rows)
    assert all(
        r["WORLD_SIZE"] == "2" and r["ACCELREG_SLURM_TASK"].endswith(f".0.{r['task']}") for r in rows
    ), rows


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHERS = {
    "torchrun": lambda port: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port],
    "accelerate": lambda port: ["accelerate", "launch", "--num_processes", "2", "--main_process_port", port],
    "deepspeed": lambda port: ["deepspeed", "--master_port", port],
}  # fmt: skip


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_launcher_started_by_srun_keeps_its_own_ranks(slurm_cluster, tmp_path, launcher):
    """``srun -n1 accelreg run -- <launcher> probe.py`` (torchrun, ``accelerate launch``,
    DeepSpeed's): the launcher's ranks are its own (LOCAL_RANK, WORLD_SIZE=2, not Slurm's one
    task), on the step's devices. DeepSpeed's launcher sets no LOCAL_WORLD_SIZE, so one taken
    from the step (1) refused its rank 1 until accelreg run stopped setting it."""
    out = _results(tmp_path)
    command = LAUNCHERS[launcher](str(_port()))
    log = _step(slurm_cluster, out, "-n1", "--gres=npu:2", *RUN, *command, PROBE, "allreduce")
    assert "exit status 0" in log, log
    rows = records(out)
    _own_devices(rows)
    for i, row in enumerate(rows):
        assert (row["LOCAL_RANK"], row["WORLD_SIZE"], row["SLURM_PROCID"]) == (str(i), "2", "0"), row
        assert row["all_reduce"] == 12.0 and row["ASCEND_RT_VISIBLE_DEVICES"] == "0,1", row


def test_accelreg_env_says_what_slurm_allocated(slurm_cluster, tmp_path):
    """``accelreg env`` in a task: the step, the allocation, the mask it gets."""
    proc = slurm_cluster.run("srun", "-n1", "--gres=npu:1", "accelreg", "env", "--json", timeout=STEP_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = json.loads(proc.stdout)["slurm"]
    assert (s["step"], s["task"], s["node"], s["applied"], s["error"]) == (
        "0",
        "0",
        "localhost",
        False,
        None,
    ), s
    (ids,) = [g["ids"] for name, g in s["gres"].items() if name == "npu"]
    assert len(ids) == 1, s
    assert {"backend": "npu", "variable": "ASCEND_RT_VISIBLE_DEVICES", "value": ids[0], "gres": "npu",
            "set_by_slurm": False} in s["masks"], s  # fmt: skip
