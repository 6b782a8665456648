"""DeepSpeed: its accelerator is the registry's choice, and quantized checkpoints load onto the
right device.

**Accelerator.** DeepSpeed picks an accelerator with its own detection ladder, and refuses a
backend it does not list (``DS_ACCELERATOR must be one of [...]``). With this integration the
registry picks instead: at the moment DeepSpeed's accelerator module is imported
(:func:`~.handover.early`, which ``accelreg.install()`` arms from the table row), or at ``enable()``, accelreg hands
DeepSpeed an accelerator for the registry's current backend through DeepSpeed's public
``set_accelerator``. It is DeepSpeed's own class for that device type where DeepSpeed ships one
(its op builders, graphs and vendor quirks live there), and accelreg's registry accelerator
(:mod:`accelreg.integrations.deepspeed.accelerator`) for every other backend. The backend is chosen
under the rule of ``docs/reliability.md`` (:func:`accelreg.resolution.current_in_use`): in a
process a launcher started (``accelreg run`` included), a present but failing backend is a
:class:`~accelreg.errors.DeviceError`, and DeepSpeed gets a stand-in that raises it at its
first use of its accelerator — the job stops instead of training on DeepSpeed's cpu
accelerator. A ``DS_ACCELERATOR`` naming one of DeepSpeed's own accelerators is an explicit
DeepSpeed choice and is left alone; one naming a registry backend DeepSpeed does not know
(``DS_ACCELERATOR=emu``) gets that backend's accelerator. :func:`accelerator_report` and
``accelreg env`` show any disagreement. ``disable()`` gives DeepSpeed back what it had.

**Launchers.** DeepSpeed's launcher (``deepspeed``: the runner, then
``deepspeed.launcher.launch`` on each node) asks its accelerator how many devices a node has,
which variable masks them, and which variables to export to the other nodes. Under
``accelreg run`` those processes have the registry's accelerator too (the start-up hook), so
they start one rank per device of the registry's backend and mask each node with that
backend's variable; every accelerator accelreg hands over also exports ``ACCELREG_*`` to
nodes started over pdsh/ssh/MPI, so the processes there are registry-aware as well.

**Placement.** Seam: ``deepspeed.initialize`` (public; accelerate looks it up on the module at
call time, so Trainer's path goes through it too). Before the engine is built, the placement
rules are attached to the model (:func:`accelreg.placement.attach`), so
``engine.load_checkpoint`` — which always loads onto the CPU and offers no ``map_location`` —
hands each quantized layer its state on the device of the live weight (seed 000).

The folder: :mod:`.handover` (the hand-over and its report), :mod:`.accelerator` (accelreg's
registry accelerator, DeepSpeed's interface for any backend), :mod:`.placement` (the seam) and
:mod:`.integration` (the row's ``INTEGRATION``).
"""

from __future__ import annotations

from .accelerator import accelerator_for, registry_accelerator
from .handover import accelerator_report, early, prepare, unprepare
from .integration import INTEGRATION, disable, enable, enabled

__all__ = [
    "INTEGRATION",
    "accelerator_for",
    "accelerator_report",
    "disable",
    "early",
    "enable",
    "enabled",
    "prepare",
    "registry_accelerator",
    "unprepare",
]
