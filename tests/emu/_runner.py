"""Run a script in a fresh interpreter with a chosen emulated backend.

PrivateUse1 can be renamed once per process, so every backend name needs its own process.
Test code runs in such a process through the ``accelreg_emu`` marker (docs/testing.md); this
is for a script that needs a process of its own per run (a hash seed is fixed when an
interpreter starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["EMU_VARS", "emu_env", "run_file"]

#: Variables the emulator reads; cleared from the parent environment before each run so an
#: outer setting never leaks into a test.
EMU_VARS = (
    "ACCELREG_EMU_NAME",
    "ACCELREG_EMU_DEVICES",
    "ACCELREG_EMU_MEMORY",
    "ACCELREG_EMU_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "SDAA_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES",
)


def emu_env(
    name: str | None,
    *,
    devices: int | None = None,
    memory: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The parent environment with the emulator variables set as given (and others cleared)."""
    env = {k: v for k, v in os.environ.items() if k not in EMU_VARS}
    if name is not None:
        env["ACCELREG_EMU_NAME"] = name
    if devices is not None:
        env["ACCELREG_EMU_DEVICES"] = str(devices)
    if memory is not None:
        env["ACCELREG_EMU_MEMORY"] = memory
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra or {})
    return env


def run_file(
    path: str | os.PathLike[str],
    *args: str,
    name: str | None = "npu",
    devices: int | None = None,
    memory: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run the script at ``path`` with ``args`` in a fresh interpreter with the emulator set to
    ``name``; a non-zero exit raises :class:`AssertionError` with the process's output."""
    proc = subprocess.run(
        [sys.executable, os.fspath(path), *args],
        env=emu_env(name, devices=devices, memory=memory, extra=extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{path} (ACCELREG_EMU_NAME={name}) exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc
