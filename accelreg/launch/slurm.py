"""Slurm: every task of a job step gets the devices Slurm allocated to it, as registry devices.

Slurm hands accelerators out as GRES (generic resources). For its ``gpu`` type it sets
``SLURM_STEP_GPUS`` (and each GPU runtime's own variable, which other runtimes ignore), per task with ``--gpus-per-task`` and shared by the step's tasks on a node with
``--gres=gpu:N``; for any other type (``Gres=npu:8``) it sets nothing, and the indices show only
in ``scontrol show job -d`` (``npu:2(IDX:0-1)``). Here, in a task of a Slurm step:

* :func:`plan` finds which devices of each installed backend Slurm allocated to this task —
  the first of the backend's GRES names (:attr:`~accelreg.types.BackendSpec.gres_names`) the
  task has — asking ``scontrol`` once (one process, both questions) and only when a backend
  declares a type other than ``gpu``; and the ``torch.distributed`` variables the task's
  rank needs (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: the
  ones every launcher sets for its own ranks), from Slurm's, never replacing one a launcher set.
* :func:`step_environ` is that plan as environment variables: each backend's visible-devices
  mask, ``ACCELREG_DEVICE_ID`` for devices bound to this one task, the rank variables, and
  ``ACCELREG_SLURM_TASK`` (``<job>.<step>.<task>``), which tells every process the task
  starts that its mask is already set (Slurm is asked once per task).
* ``accelreg run`` applies it before it starts its command (:func:`accelreg.launch.job.run`);
  the start-up hook (``ACCELREG_AUTO_INSTALL=1``) applies it in the task's first Python process
  (:func:`apply`, after the cheap check of :mod:`.slurm_task`), before any runtime reads its mask.

Nothing here runs outside a Slurm step (``SLURM_STEP_ID`` unset): a batch script's shell is no
task. See docs/scaling.md, "Slurm".
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _warn, registry
from ..errors import AccelregError, DeviceError
from ..registry.probing import package_installed
from ..registry.visible import mask_value
from .slurm_task import ENV_TASK

__all__ = [
    "ENV_TASK",
    "SCONTROL_TIMEOUT",
    "Allocation",
    "SlurmPlan",
    "SlurmTask",
    "allocation",
    "apply",
    "expand_hostlist",
    "master_port",
    "parse_gres",
    "parse_job_gres",
    "parse_step_gres",
    "plan",
    "report",
    "scontrol",
    "step_environ",
    "task",
]

#: Seconds ``scontrol`` may take: a client whose controller is gone retries for minutes.
SCONTROL_TIMEOUT = 10.0
#: Slurm's own GRES type for GPUs: the one type Slurm sets variables for (per task or per step).
GPU = "gpu"
#: The variable Slurm sets for ``gpu`` GRES next to each GPU runtime's own mask, to the same
#: value: a backend's mask that holds exactly this value was set by Slurm, and is kept.
_SLURM_GPU_ORDINAL = "GPU_DEVICE_ORDINAL"
#: What ``init_process_group()`` reads from the environment, and what torchrun, DeepSpeed's
#: launcher and ``accelerate launch`` set for their ranks. Not ``LOCAL_WORLD_SIZE``: DeepSpeed's
#: launcher does not set it, and a step's value would then bound its ranks (``srun -n1``: 1).
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: ``gpu:2(IDX:0-1)``, ``gpu:a100:1(IDX:3)``, ``npu:2(IDX:0,2)``, ``npu:2(IDX:N/A)``.
_GRES_ENTRY = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?::[^:(),\s]+)?:([0-9]+)(?:\(IDX:([^)]*)\))?")
#: ``Nodes=node[1-2] CPU_IDs=0-3 Mem=0 GRES=npu:2(IDX:0-1)`` in ``scontrol -d -o show job``.
_NODE_GROUP = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")
#: ``TresPerNode=gres:npu:1`` (also ``gres/npu:1``, ``gres:gpu:a100:1``) in ``show step``.
_STEP_TRES = re.compile(r"(?:^|\s)TresPer(Node|Task|Step)=(\S+)")
_TRES_GRES = re.compile(r"gres[:/]([A-Za-z][A-Za-z0-9_]*)(?::[^:,\s]+)?:([0-9]+)")
_RANGE = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")


@dataclass(frozen=True)
class SlurmTask:
    """This process's place in a Slurm job step, from Slurm's variables."""

    job: str
    step: str
    rank: str
    local_rank: str
    node: str

    @property
    def ident(self) -> str:
        """``<job>.<step>.<task>``: what :data:`ENV_TASK` holds once the task's mask is set."""
        return f"{self.job}.{self.step}.{self.rank}"


@dataclass(frozen=True)
class Allocation:
    """The devices Slurm allocated to one task, by GRES type: physical ids on its node.

    Attributes:
        gres: ``{type: ids}``; ``ids`` is ``None`` when Slurm counts the type but names no
            devices (a GRES without ``File=``).
        per_task: The types bound to this task alone (``--gpus-per-task``: Slurm's
            ``SLURMD_TRES_BIND``); the others are shared by the step's tasks on the node.
        source: ``{type: where it was read}`` (``SLURM_STEP_GPUS``, ``scontrol show job -d 12``).
    """

    gres: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    per_task: frozenset[str] = frozenset()
    source: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SlurmPlan:
    """What a Slurm task's environment gets (:func:`plan`).

    Attributes:
        task: The task.
        allocation: What Slurm allocated to it.
        masks: ``(backend, variable, value, gres type, kept)`` for each backend whose devices
            Slurm allocated; ``kept`` when Slurm set that variable itself, in a numbering of its
            own (relative to a device cgroup), which is kept.
        device_ids: ``{backend: physical id}`` for devices bound to this task alone
            (``ACCELREG_DEVICE_ID``: the task's device is that one, whatever its local rank).
        ranks: The ``torch.distributed`` variables to set (those not set already).
    """

    task: SlurmTask
    allocation: Allocation
    masks: tuple[tuple[str, str, str, str, bool], ...]
    device_ids: dict[str, str]
    ranks: dict[str, str]


def task(environ: Mapping[str, str] | None = None) -> SlurmTask | None:
    """This process's Slurm task, or ``None`` outside a Slurm step (``SLURM_STEP_ID`` unset)."""
    env = os.environ if environ is None else environ
    if not registry.in_slurm_step(env):
        return None
    get = lambda name: (env.get(name) or "").strip()  # noqa: E731
    return SlurmTask(
        job=get("SLURM_JOB_ID") or get("SLURM_JOBID"),
        step=get("SLURM_STEP_ID"),
        rank=get("SLURM_PROCID") or "0",
        local_rank=get("SLURM_LOCALID") or "0",
        node=get("SLURMD_NODENAME") or (env.get("HOSTNAME") or ""),
    )


# -- Slurm's words ------------------------------------------------------------------------
def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names: ``"n[01-03,7],gpu1"`` -> n01, n02, n03, n7, gpu1."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        parts = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            parts = [p + literal for p in parts]
            if ranges:
                parts = [p + n for p in parts for n in _ranges(ranges, pad=True)]
        hosts.extend(p for p in parts if p)
    return hosts


def _ranges(text: str, *, pad: bool = False) -> list[str]:
    """``"0-2,5"`` -> 0, 1, 2, 5 (zero-padded to the width written, with ``pad``)."""
    out: list[str] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"{part.strip()!r} is not an index or a range of them")
        first, last = m.group(1), m.group(2) or m.group(1)
        width = len(first) if pad else 0
        out.extend(str(i).zfill(width) for i in range(int(first), int(last) + 1))
    return out


def parse_gres(text: str) -> dict[str, tuple[str, ...] | None]:
    """A node's GRES in ``scontrol show job -d``: ``"gpu:a100:2(IDX:0-1),npu:1(IDX:3)"`` ->
    ``{"gpu": ("0", "1"), "npu": ("3",)}``; a type without indices (``IDX:N/A``, or none) maps
    to ``None``."""
    out: dict[str, tuple[str, ...] | None] = {}
    for m in _GRES_ENTRY.finditer(text):
        name, count, idx = m.group(1), int(m.group(2)), m.group(3)
        if count == 0:
            continue
        try:
            ids: tuple[str, ...] | None = tuple(_ranges(idx)) if idx else None
        except ValueError:
            ids = None
        before = out.get(name, ())
        out[name] = None if ids is None or before is None else tuple(dict.fromkeys((*before, *ids)))
    return out


def parse_job_gres(job_line: str, node: str) -> dict[str, tuple[str, ...] | None]:
    """The GRES a job has on ``node``, from ``scontrol -d -o show job`` (its ``Nodes=...
    GRES=...`` groups)."""
    out: dict[str, tuple[str, ...] | None] = {}
    for m in _NODE_GROUP.finditer(job_line):
        if node in expand_hostlist(m.group(1)):
            out.update(parse_gres(m.group(2)))
    return out


def parse_step_gres(step_line: str) -> dict[str, tuple[str, int]]:
    """What a step asked for, by GRES type, from ``scontrol -o show step``: ``{"npu":
    ("Node", 1)}`` for ``TresPerNode=gres:npu:1`` (``Task``, ``Step`` likewise)."""
    out: dict[str, tuple[str, int]] = {}
    for m in _STEP_TRES.finditer(step_line):
        for g in _TRES_GRES.finditer(m.group(2)):
            out[g.group(1)] = (m.group(1), int(g.group(2)))
    return out


def master_port(job: str, step: str) -> int:
    """The port rank 0 of a step listens on: ``15000 + (job * 16 + step) % 15000`` (below the
    kernel's ephemeral ports; two steps of one job, or two jobs, get different ports)."""
    j = int(job) if job.isdecimal() else 0
    s = int(step) if step.isdecimal() else 0
    return 15000 + (j * 16 + s) % 15000


# -- asking Slurm -------------------------------------------------------------------------
def scontrol(job: str, step: str, timeout: float = SCONTROL_TIMEOUT) -> tuple[str, str]:
    """``(job, step)``: the one-line records ``scontrol -d -o`` prints for ``show job JOB`` and
    ``show step JOB.STEP``, asked in one process. Raises :class:`DeviceError` saying why when
    Slurm cannot answer (no ``scontrol``, no controller within ``timeout`` seconds, an error)."""
    what = f"scontrol show job -d {job} (Slurm job {job}, step {step})"
    try:
        done = subprocess.run(
            ["scontrol", "-d", "-o"],
            input=f"show job {job}\nshow step {job}.{step}\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise DeviceError(
            f"cannot ask Slurm which devices this task has: {what}: scontrol is not on PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise DeviceError(
            f"cannot ask Slurm which devices this task has: {what} did not answer within {timeout:g} s "
            "(is slurmctld reachable from this node?)"
        ) from None
    except OSError as exc:
        raise DeviceError(f"cannot ask Slurm which devices this task has: {what}: {exc}") from None
    job_line = next(
        (line[line.index("JobId=") :] for line in done.stdout.splitlines() if "JobId=" in line), ""
    )
    step_line = next(
        (line[line.index("StepId=") :] for line in done.stdout.splitlines() if "StepId=" in line), ""
    )
    if not job_line:
        said = " ".join((done.stderr or done.stdout).split())[:300] or f"exit status {done.returncode}"
        raise DeviceError(f"cannot ask Slurm which devices this task has: {what}: {said}")
    return job_line, step_line


Query = Callable[[str, str], "tuple[str, str]"]


def allocation(
    environ: Mapping[str, str], names: set[str] | frozenset[str], query: Query | None = None
) -> Allocation:
    """What Slurm allocated to this task of the GRES types ``names``.

    ``gpu``: ``SLURM_STEP_GPUS`` (per task when ``SLURMD_TRES_BIND`` binds ``gpu``). Any other
    type: this node's ``IDX`` in ``scontrol show job -d`` (``query``, asked only for such types),
    which is the step's too unless the step asked for fewer of that type — Slurm 22.05 does not
    say which of the job's devices such a step got, so that is a :class:`DeviceError`, never a
    guess. Raises :class:`DeviceError` when Slurm cannot answer.
    """
    t = task(environ)
    if t is None:
        return Allocation()
    gres: dict[str, tuple[str, ...] | None] = {}
    source: dict[str, str] = {}
    per_task: set[str] = set()
    if GPU in names and environ.get("SLURM_STEP_GPUS") is not None:
        gres[GPU] = tuple(i.strip() for i in environ["SLURM_STEP_GPUS"].split(",") if i.strip())
        source[GPU] = "SLURM_STEP_GPUS"
        if re.search(r"(?:^|[,;])gpu:", environ.get("SLURMD_TRES_BIND", "")):
            per_task.add(GPU)
    custom = set(names) - {GPU}
    if custom:
        job_line, step_line = (query or scontrol)(t.job, t.step)
        on_node = parse_job_gres(job_line, t.node)
        asked = parse_step_gres(step_line)
        tasks_here = registry.slurm_tasks_on_node(environ) or 1
        for name in sorted(custom & set(on_node)):
            ids = on_node[name]
            if not ids:
                raise DeviceError(
                    f"Slurm job {t.job} has {name} GRES on {t.node} but names no devices for them "
                    f"(no File= for {name} in gres.conf): accelreg cannot tell which {name} devices are "
                    "this task's"
                )
            per, count = asked.get(name, ("Node", len(ids)))
            wanted = {"Node": count, "Task": count * tasks_here}.get(per, count)
            if wanted < len(ids):
                raise DeviceError(
                    f"Slurm step {t.job}.{t.step} asked for {name}:{count} per {per.lower()}, but job {t.job} "
                    f"has {name} {','.join(ids)} on {t.node}, and Slurm does not say which of them the step "
                    f"got: give the step all of the job's {name} (srun --gres={name}:{len(ids)}), or run it "
                    "as a job of its own"
                )
            gres[name] = ids
            source[name] = f"scontrol show job -d {t.job}"
    return Allocation(gres=gres, per_task=frozenset(per_task), source=source)


# -- the plan -----------------------------------------------------------------------------
def _installed(b: Any) -> bool:
    """A backend whose runtime is here (its package installed, or shipped with torch), not
    disabled, with a mask to set: the ones Slurm's devices can be for (no probe is run)."""
    if b.name == "cpu" or b.blocked is not None or not b.spec.visible_devices_var or not b.spec.gres_names:
        return False
    package = b.spec.runtime_package
    try:
        return package is None or package_installed(package)
    except Exception:  # noqa: BLE001 - a broken install is not a runtime that is here
        return False


def plan(environ: Mapping[str, str] | None = None, query: Query | None = None) -> SlurmPlan | None:
    """What this Slurm task's environment gets, or ``None`` outside a Slurm step.

    For each backend whose runtime is installed here, not disabled and with a visible-devices
    variable (no probe runs: a runtime must not start before its mask is set), the first of
    its GRES names that Slurm allocated to this task gives its mask: the physical ids, or,
    for ``gpu`` GRES whose mask Slurm set itself in its own numbering (the variable equals
    Slurm's ``GPU_DEVICE_ORDINAL``, relative to a device cgroup), Slurm's value, kept. Devices bound to this task alone also go into
    ``ACCELREG_DEVICE_ID``. Raises :class:`DeviceError` when Slurm cannot answer.
    """
    env = os.environ if environ is None else environ
    t = task(env)
    if t is None:
        return None
    snap = registry.get()
    backends = [b for b in snap.order if _installed(b)]
    wanted = {name for b in backends for name in b.spec.gres_names}
    alloc = allocation(env, wanted, query) if wanted else Allocation()
    masks: list[tuple[str, str, str, str, bool]] = []
    device_ids: dict[str, str] = {}
    for b in backends:
        name = next((n for n in b.spec.gres_names if alloc.gres.get(n) is not None), None)
        if name is None:
            continue
        ids = alloc.gres[name] or ()
        var = b.spec.visible_devices_var
        value = mask_value(list(ids))
        current = env.get(var)
        # Slurm's own numbering (relative under a device cgroup) for the runtimes it serves
        kept = (
            name == GPU
            and current is not None
            and current == env.get(_SLURM_GPU_ORDINAL)
            and current != value
        )
        if kept and current is not None:
            value = current
        parsed, problem = registry.parse_visible(b.spec, value)
        if problem is not None or parsed is None:
            raise DeviceError(
                f"Slurm's {name} devices {value!r} are not a mask {b.name} accepts ({var}): {problem}"
            )
        masks.append((b.name, var, value, name, kept))
        if name in alloc.per_task and parsed:
            device_ids[b.name] = parsed[0]
    return SlurmPlan(
        task=t, allocation=alloc, masks=tuple(masks), device_ids=device_ids, ranks=_ranks(env, t)
    )


def _ranks(env: Mapping[str, str], t: SlurmTask) -> dict[str, str]:
    """The ``torch.distributed`` variables of this task, from Slurm's; one a launcher set is
    kept (``accelreg run`` inside a task started by another ``accelreg run`` recomputes its own)."""
    ours = env.get(ENV_TASK) not in (None, "", t.ident)  # set by an outer Slurm task's plan
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_hostlist(nodes)
    size = (env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "").strip()
    values = {
        "RANK": t.rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": t.local_rank,
        "MASTER_ADDR": hosts[0] if hosts else "",
        "MASTER_PORT": str(master_port(t.job, t.step)),
    }
    return {k: v for k, v in values.items() if v and (ours or not (env.get(k) or "").strip())}


def step_environ(environ: Mapping[str, str] | None = None, *, masks: bool = True) -> dict[str, str]:
    """The variables to set in this Slurm task (empty outside a step): each allocated
    backend's mask (unless ``masks`` is false: ``accelreg run --devices`` chose devices),
    ``ACCELREG_DEVICE_ID`` for devices bound to the task alone, the ``torch.distributed``
    variables and :data:`ENV_TASK`. Raises :class:`DeviceError` when Slurm cannot answer."""
    p = plan(environ)
    if p is None:
        return {}
    out: dict[str, str] = {}
    if masks:
        out.update({var: value for _, var, value, _, _ in p.masks})
        if p.device_ids:
            out[registry.DEVICE_ID_VAR] = ",".join(f"{name}={ident}" for name, ident in p.device_ids.items())
    out.update(p.ranks)
    out[ENV_TASK] = p.task.ident
    return out


def apply() -> None:
    """The start-up hook's part, in a Slurm task whose mask is not set yet
    (:func:`accelreg.launch.slurm_task.pending`) (no ``accelreg run`` in front): set it, and the rank
    variables, in this process's environment, before any runtime reads them. Slurm failing to
    answer is a warning (a hook never raises into interpreter start-up); ``accelreg run``
    stops instead."""
    t = task()
    if t is None or os.environ.get(ENV_TASK) == t.ident:
        return
    try:
        os.environ.update(step_environ())
    except AccelregError as exc:
        _warn.warn_once(
            f"accelreg: Slurm task {t.ident}: {exc}; its devices are not masked (run it under `accelreg run` to stop instead)"
        )
        return
    registry.refresh()


def report(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """``accelreg env``'s Slurm section: the step and task, what Slurm allocated and what the
    task's environment gets (or why Slurm could not say); ``None`` outside a Slurm step."""
    env = os.environ if environ is None else environ
    t = task(env)
    if t is None:
        return None
    out: dict[str, Any] = {
        "job": t.job,
        "step": t.step,
        "task": t.rank,
        "local_task": t.local_rank,
        "tasks": (env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "").strip() or None,
        "node": t.node,
        "applied": env.get(ENV_TASK) == t.ident,
        "gres": {},
        "per_task": [],
        "masks": [],
        "device_id": None,
        "ranks": {},
        "error": None,
    }
    try:
        p = plan(env)
    except AccelregError as exc:
        out["error"] = str(exc)
        return out
    assert p is not None
    out["gres"] = {
        name: {"ids": list(ids) if ids is not None else None, "source": p.allocation.source.get(name, "")}
        for name, ids in p.allocation.gres.items()
    }
    out["per_task"] = sorted(p.allocation.per_task)
    out["masks"] = [
        {"backend": b, "variable": var, "value": value, "gres": name, "set_by_slurm": kept}
        for b, var, value, name, kept in p.masks
    ]
    out["device_id"] = ",".join(f"{n}={i}" for n, i in p.device_ids.items()) or None
    out["ranks"] = {k: env.get(k) or p.ranks.get(k) for k in _RANK_VARS if env.get(k) or p.ranks.get(k)}
    return out
