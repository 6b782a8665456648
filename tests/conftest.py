from __future__ import annotations

import importlib
import sys

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def fresh_registry(accelreg_fresh):
    """Every test starts from a registry built from a clean environment in an empty folder
    (the ``accelreg_fresh`` fixture of accelreg's pytest plugin); plugin modules the test
    imported are forgotten afterwards."""
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name.startswith("fakeplugin"):
            del sys.modules[name]
    importlib.invalidate_caches()
