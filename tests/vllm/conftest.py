"""Fixtures of the vLLM tests (tests/vllm): the emulated accelerator built once, up front, for
the tests that start processes on it (a cold build takes longer than a probe may wait)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def emu_built() -> None:
    """The emulator's extension, built into the session's cache (nothing when it is warm)."""
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg_emu", "build"], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.fail(
            f"building the accelreg-emu extension failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False
        )
