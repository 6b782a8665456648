from __future__ import annotations

import importlib
import os
import sys

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """Build the emulated accelerator (and keep matplotlib's font cache) in the checkout's
    pytest cache, not ``~/.cache``.

    Set once per session (children started by the tests inherit it), so the extension is built
    at most once per checkout and source hash; an ``ACCELREG_EMU_CACHE`` the caller set wins.
    Without the cache provider (``-p no:cacheprovider``) it goes under pytest's base temporary
    directory, built once for that session.
    """
    cache = getattr(config, "cache", None)
    for var, name in (("ACCELREG_EMU_CACHE", "accelreg-emu"), ("MPLCONFIGDIR", "matplotlib")):
        if os.environ.get(var):
            continue
        if cache is not None:
            where = cache.mkdir(name)
        else:
            from _pytest.tmpdir import TempPathFactory

            where = TempPathFactory.from_config(config, _ispytest=True).mktemp(name, numbered=False)
        os.environ[var] = str(where)


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
