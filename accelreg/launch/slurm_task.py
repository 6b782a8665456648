"""Which task of a Slurm step this process is, and whether its mask is set: the cheap check the
start-up hook makes in every Python process of a Slurm task.

Only the first Python process of a task whose mask is not set yet (no ``accelreg run`` in front,
``ACCELREG_AUTO_INSTALL=1``: :func:`pending`) goes on to :func:`accelreg.launch.slurm.apply`,
which loads the registry and asks Slurm; every other one pays a few environment lookups.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # imported by the start-up hook: nothing Python has not loaded
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ENV_TASK", "pending", "task_ident"]

#: Set for a Slurm task's processes once its mask is set: ``<job>.<step>.<task>``.
ENV_TASK = "ACCELREG_SLURM_TASK"


def task_ident(environ: Mapping[str, str]) -> str | None:
    """``<job>.<step>.<task>`` of this Slurm task, or ``None`` outside a step (``SLURM_STEP_ID``
    unset: a batch script's shell is no task)."""
    step = (environ.get("SLURM_STEP_ID") or "").strip()
    if not step:
        return None
    job = (environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "").strip()
    return f"{job}.{step}.{(environ.get('SLURM_PROCID') or '0').strip()}"


def pending(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a task of a Slurm step whose mask is not set yet."""
    env = os.environ if environ is None else environ
    ident = task_ident(env)
    return ident is not None and env.get(ENV_TASK) != ident
