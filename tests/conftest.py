from __future__ import annotations

import importlib
import os
import sys

import pytest

import accelreg

_PREFIXES = ("ACCELREG_", "XDG_CONFIG_HOME")
_VARS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "CUDA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "SDAA_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES",
)


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch, tmp_path):
    """Every test starts from a registry built from a clean environment in an empty folder."""
    for key in list(os.environ):
        if key.startswith(_PREFIXES) or key in _VARS:
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    accelreg.reset()
    modules = set(sys.modules)
    yield
    accelreg.reset()
    for name in set(sys.modules) - modules:
        if name.startswith("fakeplugin"):
            del sys.modules[name]
    importlib.invalidate_caches()
