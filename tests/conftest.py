from __future__ import annotations

import importlib
import os
import sys

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """Build the emulated accelerator into the checkout's pytest cache, not ``~/.cache``.

    Set once per session (children started by the tests inherit it), so the extension is built
    at most once per checkout and source hash; an ``ACCELREG_EMU_CACHE`` the caller set wins.
    Without the cache provider (``-p no:cacheprovider``) it goes under pytest's base temporary
    directory, built once for that session.
    """
    if os.environ.get("ACCELREG_EMU_CACHE"):
        return
    cache = getattr(config, "cache", None)
    if cache is not None:
        where = cache.mkdir("accelreg-emu")
    else:
        from _pytest.tmpdir import TempPathFactory

        where = TempPathFactory.from_config(config, _ispytest=True).mktemp("accelreg-emu", numbered=False)
    os.environ["ACCELREG_EMU_CACHE"] = str(where)


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
