"""Environments for tests: the registry's variables cleared, or an emulated accelerator set up."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..builtin import visible_devices_vars
from ..registry import LAUNCHER_VARS, SLURM_STEP_VAR

__all__ = ["CHILD_VAR", "MARKER_ENV_VAR", "RESULTS_VAR", "clean_environ", "emu_environ", "registry_vars"]

#: Set in a child started by the ``accelreg_emu`` marker: run the test body here.
CHILD_VAR = "ACCELREG_TESTING_CHILD"
RESULTS_VAR = "ACCELREG_TESTING_RESULTS"
#: In such a child: the names (a JSON list) of the variables the marker itself set, which the
#: ``accelreg_fresh`` fixture keeps (they are the environment the test asked for).
MARKER_ENV_VAR = "ACCELREG_TESTING_ENV"
#: Variables a fresh registry must not inherit (the emulator's own ``ACCELREG_EMU_*`` and the
#: testing variables are kept: they describe the process, not the configuration under test).
_KEEP_PREFIXES = ("ACCELREG_EMU_", "ACCELREG_TESTING_")


def registry_vars() -> set[str]:
    """Every variable that changes what the registry answers: ACCELREG_*, ranks, masks."""
    names = {k for k in os.environ if k.startswith("ACCELREG_") and not k.startswith(_KEEP_PREFIXES)}
    names.update(LAUNCHER_VARS)  # a local rank picks the device; any refuses a silent cpu
    names.add(SLURM_STEP_VAR)  # Slurm's task variables count only inside a step
    names.update(visible_devices_vars())  # each built-in backend's masking variable
    names.add("ACCELREG_EMU_VISIBLE_DEVICES")
    return names


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` without registry-affecting variables, plus ``extra``."""
    drop = registry_vars()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


def emu_environ(
    name: str = "emu", devices: int = 2, memory: str | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a process whose emulated accelerator is ``name`` x ``devices``."""
    env = clean_environ({"ACCELREG_EMU_NAME": name, "ACCELREG_EMU_DEVICES": str(devices)})
    if memory is not None:
        env["ACCELREG_EMU_MEMORY"] = str(memory)
    env.update({k: str(v) for k, v in extra.items()})
    return env
