"""Fixtures of the emulator test group (tests/emu).

The group needs the ``accelreg-emu`` distribution installed
(``pip install -e plugins/accelreg-emu``). Before the first test (one that the ``accelreg_emu``
marker runs in a child included) it compiles both variants of the extension into the cache (in
parallel, about 30 s on two cores when cold, nothing when warm), so no test pays for a build on
its own. The cache is the one the top-level
conftest chose for the session (``ACCELREG_EMU_CACHE``), which pytest-xdist's workers and the
``accelreg_emu`` marker's children inherit: one build per checkout and source change.

A child started by the ``accelreg_emu`` marker builds nothing up front (its parent's session
did, or the emulator's first use does, under the cache's lock: a child costs no extra
interpreter start), and runs offline and quiet (no hub access, no transformers chatter).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from accelreg.testing import CHILD_VAR

IN_CHILD = bool(os.environ.get(CHILD_VAR))

if IN_CHILD:  # before any test module imports transformers (it reads these at import)
    for _key, _value in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ):
        os.environ.setdefault(_key, _value)


#: The session's build: "" once it succeeded, else why it failed (every test fails with it).
_built: list[str] = []


def _build_extension() -> None:
    """Compile both variants into the cache, once per session (nothing to do when warm)."""
    if importlib.util.find_spec("accelreg_emu") is None:
        pytest.fail("accelreg-emu is not installed: run `pip install -e plugins/accelreg-emu`", pytrace=False)
    if IN_CHILD:
        return
    if not _built:
        proc = subprocess.run(
            [sys.executable, "-m", "accelreg_emu", "build"], capture_output=True, text=True, timeout=600
        )
        failed = f"building the accelreg-emu extension failed:\n{proc.stdout}\n{proc.stderr}"
        _built.append(failed if proc.returncode != 0 else "")
    if _built[0]:
        pytest.fail(_built[0], pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def emu_extension_built() -> None:
    _build_extension()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Also before a test the ``accelreg_emu`` marker runs in a child: the parent sets up none of
    its fixtures (the one above included), and a child whose first use of the emulator is a
    registry probe (Ray's node start asks the registry) would compile it inside that probe, which
    ``probe_timeout`` (60 s) cuts off on a loaded machine: the backend would look broken."""
    _build_extension()
