"""``accelreg run``'s work: replace this process with a job's command, every Python process of it
asking the registry.

Only a job with ``--devices`` needs the registry (to find the backend's visible-devices variable
and check the ids): :mod:`.masks` is imported then, so a plain ``accelreg run -- CMD`` starts its
command without loading pluggy, the plugins or a runtime (see docs/benchmarks.md, "Start-up").
In a task of a Slurm step (``SLURM_STEP_ID`` set) :mod:`.slurm` is imported too: the devices
Slurm allocated to the task become its masks, and Slurm's ranks the ``torch.distributed`` ones.
"""

from __future__ import annotations

import os

from .startup import ENV_RUN

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["devices_problem", "run"]


def devices_problem(backend: str | None, ids: Sequence[int | str]) -> str | None:
    """What is wrong with ``ids`` as ``backend``'s devices (its own parser judges), or ``None``:
    :func:`accelreg.launch.masks.ids_problem`, loaded only when a job names devices."""
    from .masks import ids_problem

    return ids_problem(backend, ids)


def run(backend: str | None, ids: Sequence[int | str] | None, command: Sequence[str]) -> None:
    """Replace this process with ``command`` as a job of the registry (never returns).

    Every Python process ``command`` starts installs accelreg's integrations at start-up
    (``ACCELREG_RUN`` is set for it: see :mod:`accelreg.launch.startup`) and counts as started by
    a launcher (a present but failing backend is an error there, never a silent cpu). With
    ``ids``, the backend's visible-devices variable makes those physical devices the job's
    logical devices 0..n-1; ids the backend does not have are refused first
    (:func:`~accelreg.launch.masks.check_devices_exist`). In a task of a Slurm step, the
    devices Slurm allocated to the task become each backend's mask (unless ``ids`` chose
    devices) and Slurm's ranks ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...
    (:func:`~accelreg.launch.slurm.step_environ`; a :class:`~accelreg.errors.DeviceError` when
    Slurm cannot say). Exit status and signals are the command's own: this process becomes it.
    """
    env = dict(os.environ)
    if env.get("SLURM_STEP_ID"):
        from .slurm import step_environ

        env.update(step_environ(env, masks=ids is None))
    if ids is not None:
        from .masks import check_devices_exist, visible_devices_env

        env.update(visible_devices_env(backend, ids))
        check_devices_exist(backend, ids)
    env[ENV_RUN] = "1"
    os.execvpe(command[0], list(command), env)
