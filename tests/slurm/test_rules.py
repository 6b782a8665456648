"""Slurm's rules without a cluster: Slurm's local rank counts only inside a step, what Slurm
allocated becomes each backend's mask, the ranks ``accelreg run`` supplies, Slurm's own words
(host lists, ``scontrol`` records recorded from the real cluster of ``test_cluster.py``), and
what happens when Slurm cannot answer. Scripted backends; ``scontrol`` replaced where named.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import accelreg
from accelreg import DeviceError, registry
from accelreg.cli.env import slurm_lines
from accelreg.launch import slurm, slurm_task
from accelreg.registry import DEVICE_ID_VAR
from accelreg.testing import run_python

from .._fakes import plugin, spec
from ..test_schemas import problems, schema

VAR = "ACME_VISIBLE_DEVICES"
#: ``scontrol -d -o show job 13`` / ``show step 13.0`` on the test cluster (Slurm 22.05.8), cut.
JOB = (
    "JobId=13 JobName=bash UserId=root(0) JobState=RUNNING NodeList=localhost BatchHost=localhost "
    "NumNodes=1 NumCPUs=1 NumTasks=1 TRES=cpu=1,node=1,billing=1 JOB_GRES=npu:1   Nodes=localhost "
    "CPU_IDs=1 Mem=0 GRES=npu:1(IDX:0) MinCPUsNode=1 Command=bash TresPerNode=gres:npu:1 "
)
STEP = (
    "StepId=13.0 UserId=0 State=RUNNING Partition=debug NodeList=localhost Nodes=1 CPUs=1 Tasks=1 "
    "Name=bash TRES=cpu=1,mem=0,node=1 TresPerStep=cpu:1 TresPerNode=gres:npu:1"
)
#: Two groups of nodes, types and a GRES without indices (made up in Slurm's format).
JOB_MULTI = (
    "JobId=7 JOB_GRES=acme:4,gpu:1 Nodes=n[01-02] CPU_IDs=0-3 Mem=0 GRES=acme:2(IDX:0,2) "
    "Nodes=n03 CPU_IDs=0 Mem=0 GRES=acme:x1:1(IDX:3),gpu:a100:1(IDX:1),bare:2 Features=(null)"
)


def _step_env(monkeypatch, **extra: str) -> None:
    """A task of step 13.0 of job 13 on ``localhost``: 2 tasks there, this one rank 1."""
    base = {
        "SLURM_JOB_ID": "13",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "localhost",
        "SLURM_STEP_NODELIST": "localhost",
    }
    for key, value in {**base, **extra}.items():
        monkeypatch.setenv(key, value)


def _acme(count: int = 2, **extra) -> None:
    extra.setdefault("gres", ("acme", "gpu"))
    accelreg.register(
        plugin(spec("acme", count, priority=200, device_type="ve", var=VAR, **extra)), "fakeplugin_acme"
    )


def _scontrol(monkeypatch, job: str = JOB, step: str = STEP) -> list[tuple[str, str]]:
    asked: list[tuple[str, str]] = []

    def fake(job_id: str, step_id: str) -> tuple[str, str]:
        asked.append((job_id, step_id))
        return job, step

    monkeypatch.setattr(slurm, "scontrol", fake)
    return asked


# -- the local rank -----------------------------------------------------------------------
def test_slurm_localid_picks_the_device_inside_a_step(monkeypatch):
    _step_env(monkeypatch)
    _acme()
    assert accelreg.resolve() == torch.device("ve", 1)
    assert registry.get().launcher == ("SLURM_LOCALID", "1")


def test_a_batch_scripts_shell_is_no_task(monkeypatch):
    """sbatch's shell has SLURM_LOCALID=0 and SLURM_PROCID=0 but no SLURM_STEP_ID."""
    _step_env(monkeypatch, SLURM_LOCALID="1")
    monkeypatch.delenv("SLURM_STEP_ID")
    _acme()
    assert accelreg.resolve() == torch.device("ve", 0)  # the runtime's current device
    snap = registry.get()
    assert snap.local_rank is None and snap.launcher is None


def test_a_launchers_own_rank_wins_and_slurms_counts_do_not_bound_it(monkeypatch):
    """torchrun started by ``srun -n1``: its rank 1 of 2 on the node, though Slurm ran 1 task."""
    _step_env(
        monkeypatch,
        SLURM_LOCALID="0",
        SLURM_NTASKS="1",
        SLURM_STEP_NUM_TASKS="1",
        SLURM_STEP_TASKS_PER_NODE="1",
    )
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    _acme()
    assert accelreg.resolve() == torch.device("ve", 1)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1"}, r"SLURM_LOCALID=2, but SLURM_STEP_TASKS_PER_NODE=2"),
        ({"SLURM_LOCALID": "3", "SLURM_STEP_TASKS_PER_NODE": "x", "SLURM_NTASKS_PER_NODE": "3"}, r"SLURM_NTASKS_PER_NODE=3"),
        ({"SLURM_LOCALID": "4", "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8"}, r"SLURM_LOCALID=4, but acme has 4 devices"),
        ({"SLURM_LOCALID": "x"}, r"SLURM_LOCALID='x' is not a valid local rank"),
    ],
)  # fmt: skip
def test_a_slurm_rank_past_its_tasks_or_devices_is_an_error_not_device_0(monkeypatch, env, match):
    _step_env(monkeypatch, **env)
    _acme(4)
    with pytest.raises(DeviceError, match=match):
        accelreg.resolve()


def test_a_step_is_a_launcher_no_silent_cpu(monkeypatch):
    accelreg.register(
        plugin(spec("acme", 2, device_type="ve", available=False, runtime_package="json")),
        "fakeplugin_failing",
    )
    _step_env(monkeypatch)
    with pytest.raises(DeviceError, match=r"started by a launcher \(SLURM_LOCALID=1\)"):
        accelreg.resolve()
    monkeypatch.delenv("SLURM_STEP_ID")  # the batch shell: warned, not refused
    registry.refresh()
    with pytest.warns(RuntimeWarning, match="acme is present"):
        assert accelreg.resolve() == torch.device("cpu")


@pytest.mark.parametrize(
    ("layout", "node", "expected"),
    [
        ("2", "0", 2),
        ("2(x3),1", "2", 2),
        ("2(x3),1", "3", 1),
        ("2(x3),1", "4", None),
        ("2,junk", "1", None),
        ("", "0", None),
    ],
)
def test_tasks_on_this_node(layout, node, expected):
    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": layout, "SLURM_NODEID": node}
    assert registry.slurm_tasks_on_node(env) == expected
    assert registry.slurm_tasks_on_node({**env, "SLURM_STEP_ID": ""}) is None


# -- Slurm's words ------------------------------------------------------------------------
def test_host_lists_and_gres_records():
    assert slurm.expand_hostlist("n[01-03,7],gpu1,a[1-2]b[3-4]") == [
        "n01", "n02", "n03", "n7", "gpu1", "a1b3", "a1b4", "a2b3", "a2b4"
    ]  # fmt: skip
    assert slurm.parse_gres("gpu:a100:2(IDX:0-1),npu:1(IDX:3),shard:0,bare:2") == {
        "gpu": ("0", "1"),
        "npu": ("3",),
        "bare": None,
    }
    assert slurm.parse_job_gres(JOB, "localhost") == {"npu": ("0",)}
    assert slurm.parse_job_gres(JOB_MULTI, "n02") == {"acme": ("0", "2")}
    assert slurm.parse_job_gres(JOB_MULTI, "n03") == {"acme": ("3",), "gpu": ("1",), "bare": None}
    assert slurm.parse_job_gres(JOB_MULTI, "n04") == {}
    assert slurm.parse_step_gres(STEP) == {"npu": ("Node", 1)}
    assert slurm.parse_step_gres("StepId=6.0 TresBind=gpu:per_task:1 TresPerTask=gres:gpu:1") == {
        "gpu": ("Task", 1)
    }


def test_the_master_port_is_the_steps_own():
    ports = {slurm.master_port(str(job), str(step)) for job in range(100, 140) for step in range(4)}
    assert len(ports) == 160 and all(15000 <= p < 30000 for p in ports)


# -- allocations --------------------------------------------------------------------------
def test_gpu_gres_come_from_slurms_variables_without_asking_scontrol(monkeypatch):
    asked = _scontrol(monkeypatch)
    env = {"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "13", "SLURM_STEP_GPUS": "1"}
    a = slurm.allocation(env, {"gpu"})
    assert (a.gres, a.per_task, asked) == ({"gpu": ("1",)}, frozenset(), [])
    a = slurm.allocation({**env, "SLURMD_TRES_BIND": "gpu:per_task:1"}, {"gpu"})
    assert a.per_task == {"gpu"}


def test_custom_gres_come_from_scontrol_once(monkeypatch):
    asked = _scontrol(monkeypatch)
    env = {"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "13", "SLURMD_NODENAME": "localhost"}
    a = slurm.allocation(env, {"npu", "gpu", "mlu"})
    assert (a.gres, a.source, asked) == ({"npu": ("0",)}, {"npu": "scontrol show job -d 13"}, [("13", "0")])


@pytest.mark.parametrize(
    ("job", "step", "match"),
    [
        (
            JOB.replace("npu:1(IDX:0)", "npu:2(IDX:0-1)"),
            STEP,
            r"asked for npu:1 per node, but job 13 has npu 0,1",
        ),
        (JOB.replace("npu:1(IDX:0)", "npu:1"), STEP, r"names no devices for them \(no File= for npu"),
    ],
)
def test_an_allocation_slurm_does_not_name_is_an_error_not_a_guess(monkeypatch, job, step, match):
    _scontrol(monkeypatch, job, step)
    env = {"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "13", "SLURMD_NODENAME": "localhost"}
    with pytest.raises(DeviceError, match=match):
        slurm.allocation(env, {"npu"})


def test_tasks_sharing_the_nodes_devices_ask_for_them_per_task(monkeypatch):
    """``--tres-per-task=gres:npu:1`` with two tasks on the node covers the job's npu:2."""
    _scontrol(
        monkeypatch, JOB.replace("npu:1(IDX:0)", "npu:2(IDX:0-1)"), STEP.replace("TresPerNode", "TresPerTask")
    )
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "13",
        "SLURMD_NODENAME": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
    }
    assert slurm.allocation(env, {"npu"}).gres == {"npu": ("0", "1")}


# -- masks and ranks ----------------------------------------------------------------------
def test_a_custom_gres_becomes_the_mask_and_slurms_ranks_the_distributed_ones(monkeypatch):
    _step_env(monkeypatch)
    _scontrol(
        monkeypatch,
        JOB.replace("npu:1(IDX:0)", "acme:2(IDX:0-1)"),
        STEP.replace("npu", "acme").replace(":1", ":2"),
    )
    _acme()
    env = slurm.step_environ()
    assert env == {
        VAR: "0,1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(slurm.master_port("13", "0")),
        slurm.ENV_TASK: "13.0.1",
    }


def test_gpus_bound_to_the_task_become_its_mask_and_its_device(monkeypatch):
    _step_env(monkeypatch, SLURM_STEP_GPUS="1", SLURMD_TRES_BIND="gpu:per_task:1")
    _scontrol(monkeypatch)
    _acme(gres=("gpu",))
    env = slurm.step_environ()
    assert env[VAR] == "1" and "acme=1" in env[DEVICE_ID_VAR].split(","), env
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    registry.refresh()
    assert accelreg.resolve() == torch.device("ve", 0)  # its own device, though SLURM_LOCALID=1


def test_a_mask_slurm_set_in_its_own_numbering_is_kept(monkeypatch):
    """Under a device cgroup Slurm numbers a GPU runtime's devices from 0; the others get the
    physical ids (SLURM_STEP_GPUS)."""
    _step_env(monkeypatch, SLURM_STEP_GPUS="3", GPU_DEVICE_ORDINAL="0", CUDA_VISIBLE_DEVICES="0")
    _scontrol(monkeypatch)
    _acme()
    masks = {m[0]: m[1:] for m in slurm.plan().masks}
    assert masks["cuda"] == ("CUDA_VISIBLE_DEVICES", "0", "gpu", True)
    assert masks["acme"] == (VAR, "3", "gpu", False)


@pytest.mark.parametrize(
    ("extra", "settings"),
    [
        ({"runtime_package": "no_such_runtime_pkg"}, {}),
        ({}, {"ACCELREG_DISABLE": "acme"}),
        ({"gres": ()}, {}),
    ],
)
def test_backends_not_here_get_no_mask(monkeypatch, extra, settings):
    _step_env(monkeypatch, SLURM_STEP_GPUS="1", **settings)
    _scontrol(monkeypatch)
    _acme(**extra)
    assert VAR not in slurm.step_environ()


def test_ranks_a_launcher_set_are_kept_and_an_outer_tasks_are_not(monkeypatch):
    _step_env(monkeypatch, RANK="5", MASTER_ADDR="head")
    _scontrol(monkeypatch)
    env = slurm.step_environ()
    assert "RANK" not in env and "MASTER_ADDR" not in env and env["LOCAL_RANK"] == "1"
    monkeypatch.setenv(slurm.ENV_TASK, "12.0.0")  # set for an outer task: RANK was ours
    env = slurm.step_environ()
    assert (env["RANK"], env["MASTER_ADDR"]) == ("1", "localhost")


def test_devices_chosen_with_accelreg_run_devices_replace_slurms(monkeypatch):
    _step_env(monkeypatch, SLURM_STEP_GPUS="1")
    _scontrol(monkeypatch)
    _acme()
    env = slurm.step_environ(masks=False)
    assert VAR not in env and env["RANK"] == "1"


def test_outside_a_step_nothing_happens(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "13")
    _scontrol(monkeypatch)
    assert slurm.step_environ() == {} and slurm.plan() is None and slurm.report() is None


# -- Slurm cannot answer ------------------------------------------------------------------
def _fake_scontrol(tmp_path: Path, body: str) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "scontrol"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(bindir)


@pytest.mark.parametrize(
    ("body", "timeout", "match"),
    [
        ("echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1", 10, "Unable to contact slurm controller"),
        ("sleep 5", 0.5, r"did not answer within 0.5 s \(is slurmctld reachable"),
    ],
)  # fmt: skip
def test_scontrol_failing_or_hanging_is_a_clear_error(tmp_path, monkeypatch, body, timeout, match):
    monkeypatch.setenv("PATH", _fake_scontrol(tmp_path, body) + os.pathsep + os.environ["PATH"])
    with pytest.raises(
        DeviceError, match=f"cannot ask Slurm which devices this task has: scontrol show job -d 13 .*{match}"
    ):
        slurm.scontrol("13", "0", timeout=timeout)


def test_no_scontrol_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DeviceError, match="scontrol is not on PATH"):
        slurm.scontrol("13", "0")


def test_accelreg_run_stops_when_slurm_cannot_answer(tmp_path):
    bindir = _fake_scontrol(tmp_path, "echo 'Invalid job id specified' >&2; exit 1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(SLURM_JOB_ID="13", SLURM_STEP_ID="0", SLURM_PROCID="0", SLURMD_NODENAME="localhost")
    env["PATH"] = bindir + os.pathsep + os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg", "run", "--", sys.executable, "-c", "print('started')"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "started" not in proc.stdout, proc
    assert "accelreg run: cannot ask Slurm which devices this task has" in proc.stderr
    assert "Invalid job id specified" in proc.stderr


def test_the_start_up_hook_warns_and_leaves_the_environment(monkeypatch):
    _step_env(monkeypatch)

    def broken(job: str, step: str) -> tuple[str, str]:
        raise DeviceError("cannot ask Slurm which devices this task has: scontrol is not on PATH")

    monkeypatch.setattr(slurm, "scontrol", broken)
    before = dict(os.environ)
    with pytest.warns(RuntimeWarning, match=r"Slurm task 13.0.1: cannot ask Slurm .* not masked"):
        slurm.apply()
    assert dict(os.environ) == before


def test_the_start_up_hook_sets_the_mask_once_per_task(monkeypatch):
    _step_env(monkeypatch)
    asked = _scontrol(
        monkeypatch, JOB.replace("npu:1(IDX:0)", "acme:2(IDX:0-1)"), STEP.replace("npu:1", "acme:2")
    )
    _acme()
    with monkeypatch.context() as m:
        m.setattr(os, "environ", dict(os.environ))
        slurm.apply()
        slurm.apply()  # the task's next process: its marker says it is done
        assert (os.environ[VAR], os.environ[slurm.ENV_TASK], len(asked)) == ("0,1", "13.0.1", 1)
        assert accelreg.resolve() == torch.device("ve", 1)


# -- records, reports ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gres", "match"),
    [("npu", "is not a tuple"), (("npu", "npu"), "names 'npu' twice"), (("n-pu",), "not a Slurm GRES name"), (tuple(f"g{i}" for i in range(9)), "at most 8")],
)  # fmt: skip
def test_a_gres_slurm_cannot_take_is_refused(gres, match):
    accelreg.register(plugin(spec("acme", 1, device_type="ve", gres=gres)), "fakeplugin_badgres")
    assert "acme" not in {b.name for b in accelreg.backends()}
    errors = " | ".join(f.error for f in accelreg.failures())
    assert match in errors, errors


def test_builtin_gres_names():
    names = {b.name: b.spec.gres_names for b in registry.get().order}
    assert names["cuda"] == names["xpu"] == ("gpu",)
    assert names["mlu"] == ("mlu", "gpu") and names["hpu"] == names["mps"] == names["cpu"] == ()
    assert spec("acme", 1).gres_names == ("acme",)


def test_several_assigned_devices_one_per_backend(monkeypatch):
    monkeypatch.setenv(DEVICE_ID_VAR, "cuda=0,acme=3")
    monkeypatch.setenv(VAR, "2,3")
    _acme()
    assert accelreg.resolve() == torch.device("ve", 1)
    monkeypatch.setenv(DEVICE_ID_VAR, "acme=3,acme=2")
    registry.refresh()
    with pytest.raises(DeviceError, match="not <backend>=<physical device id>"):
        accelreg.resolve()


def test_a_mask_slurm_wrote_for_its_gpus_is_no_sign_of_hardware(monkeypatch):
    """Slurm sets CUDA_VISIBLE_DEVICES (and the others) for gpu GRES whatever the node has."""
    accelreg.register(
        plugin(spec("acme", 2, device_type="ve", available=False, var=VAR)), "fakeplugin_failing"
    )
    monkeypatch.setenv(VAR, "1")
    assert registry.get().backend("acme").presence() == "ACME_VISIBLE_DEVICES='1' is set"
    monkeypatch.setenv("GPU_DEVICE_ORDINAL", "1")
    monkeypatch.setenv("SLURM_STEP_GPUS", "1")
    registry.refresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.get().backend("acme").presence() is None


def test_accelreg_env_reports_the_step(monkeypatch):
    _step_env(monkeypatch, SLURM_STEP_GPUS="1", SLURMD_TRES_BIND="gpu:per_task:1")
    _scontrol(monkeypatch, JOB.replace("npu:1(IDX:0)", "acme:2(IDX:0-1)"), STEP.replace("npu:1", "acme:2"))
    _acme()
    report = {"slurm": json.loads(json.dumps(slurm.report()))}  # accelreg env's section, as JSON
    assert problems(report["slurm"], schema("env")["properties"]["slurm"], schema("env")) == []
    s = report["slurm"]
    assert s["gres"]["acme"] == {"ids": ["0", "1"], "source": "scontrol show job -d 13"}
    assert s["per_task"] == ["gpu"] and s["applied"] is False and s["ranks"]["RANK"] == "1"
    text = "\n".join(slurm_lines(report))
    assert "Slurm: job 13, step 0, task 1 of 2 (local 1) on localhost" in text
    assert f"Slurm mask for acme: {VAR}=0,1 (from its acme GRES; not set in this process" in text


def test_accelreg_env_says_why_slurm_cannot_tell(monkeypatch):
    _step_env(monkeypatch)
    _scontrol(monkeypatch, JOB.replace("npu:1(IDX:0)", "acme:2(IDX:0-1)"), STEP.replace("npu:1", "acme:1"))
    _acme()
    report = {"slurm": json.loads(json.dumps(slurm.report()))}
    assert problems(report["slurm"], schema("env")["properties"]["slurm"], schema("env")) == []
    assert "Slurm does not say which of them the step got" in report["slurm"]["error"]
    assert "Slurm allocation: cannot tell:" in "\n".join(slurm_lines(report))
    monkeypatch.delenv("SLURM_STEP_ID")
    registry.refresh()
    assert slurm.report() is None and slurm_lines({"slurm": None}) == []


def test_the_hook_in_a_task_whose_mask_is_set_loads_no_registry():
    """Every Python process of a task under ``accelreg run`` runs the start-up hook: once the
    task's mask is set (its marker), the hook pays a few environment lookups, not the registry."""
    code = "import sys, json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('accelreg'))))"
    task = {"SLURM_JOB_ID": "13", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "ACCELREG_RUN": "1"}
    loaded = run_python(code, name=None, env={**task, slurm.ENV_TASK: "13.0.1"}).value
    assert "accelreg.launch.slurm_task" in loaded and "accelreg.registry" not in loaded, loaded
    assert slurm_task.task_ident(task) == "13.0.1" and slurm_task.task_ident({"SLURM_JOB_ID": "13"}) is None
