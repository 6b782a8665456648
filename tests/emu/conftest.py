"""Fixtures of the emulator test group (tests/emu).

The group needs the ``accelreg-emu`` distribution installed
(``pip install -e plugins/accelreg-emu``). Before the first test it compiles both
variants of the extension into the cache (in parallel, about 30 s on two cores when cold,
nothing when warm), so no test pays for a build on its own.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def emu_extension_built() -> None:
    if importlib.util.find_spec("accelreg_emu") is None:
        pytest.fail("accelreg-emu is not installed: run `pip install -e plugins/accelreg-emu`", pytrace=False)
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg_emu", "build"], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(
            f"building the accelreg-emu extension failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False
        )
