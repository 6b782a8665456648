"""Fixtures of the emulator test group (tests/emu).

The group needs the ``accelreg-emu`` distribution installed
(``pip install -e plugins/accelreg-emu``). The session builds the extension before the first test
runs (tests/conftest.py, ``_build_the_emulator``), so no test, and no child the ``accelreg_emu``
marker starts, compiles it inside a registry probe; the cache (``ACCELREG_EMU_CACHE``) is the one
the top-level conftest chose, inherited by pytest-xdist's workers and the marker's children.

A child started by the ``accelreg_emu`` marker runs offline and quiet (no hub access, no
transformers chatter).
"""

from __future__ import annotations

import importlib.util
import os

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


def pytest_runtest_setup(item: pytest.Item) -> None:
    if importlib.util.find_spec("accelreg_emu") is None:
        pytest.fail("accelreg-emu is not installed: run `pip install -e plugins/accelreg-emu`", pytrace=False)
