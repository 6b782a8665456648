"""The integrations' layout (issue 43): one folder per host library, rows as data, folders imported
only once their library is, and the old module paths kept for one release."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import pytest

import accelreg.integrations as integrations
from accelreg.integrations import _moved, table
from accelreg.testing import run_python

#: A fresh process (no emulator): which ``accelreg.integrations.<library>`` folders are loaded.
_LOADED = """
import json, sys
def folders():
    return sorted({m.split(".")[2] for m in sys.modules
                   if m.startswith("accelreg.integrations.") and not m.split(".")[2].startswith("_")
                   and m.split(".")[2] != "table"})
"""


def test_install_with_no_host_library_imported_loads_no_library_folder() -> None:
    """``install()`` reads the table's rows (data) and arms import hooks: no library's folder, and
    no host library, is imported by it."""
    code = (
        _LOADED
        + "import accelreg\nnames = accelreg.install()\n"
        + "libs = sorted(m for m in ('transformers', 'accelerate', 'peft', 'deepspeed', 'ray', "
        "'lightning', 'vllm', 'torch', 'safetensors') if m in sys.modules)\n"
        + "print(json.dumps([folders(), names, libs]))\n"
    )
    loaded, names, libs = run_python(code, name=None).value
    assert loaded == [], loaded
    assert libs == [], libs  # not even torch: the follower waits for torch.accelerator
    assert {"accelerate", "transformers", "peft", "deepspeed"} <= set(names)


def test_a_library_import_loads_its_own_folder_and_no_other() -> None:
    """``import peft`` (which imports transformers, accelerate, safetensors and torch) loads exactly
    those libraries' folders; DeepSpeed's, Ray's, Lightning's and vLLM's stay unimported."""
    code = (
        _LOADED
        + "import accelreg\naccelreg.install()\nimport peft\nloaded = folders()\n"
        + "from accelreg.integrations import status\n"
        + "on = sorted(i['name'] for i in status() if i['enabled'])\n"
        + "print(json.dumps([loaded, on]))\n"
    )
    loaded, on = run_python(code, name=None).value
    assert set(loaded) == {"accelerate", "transformers", "peft", "torch", "safetensors"}, loaded
    assert {"accelerate", "transformers", "peft", "torch_accelerator", "safetensors"} <= set(on)


def test_install_after_a_ranks_imports_loads_no_plugin_machinery() -> None:
    """``install()`` after a training rank's imports enables every integration and reads only the
    registry's settings: the plugin machinery (pluggy, the plugin types), the queries, the
    placement rules and packaging's specifiers wait for the first device decision (issue 39:
    together about 20 ms of every rank's start-up). The first query then loads them. (Counted
    against what the libraries' own imports loaded: transformers 4.57 imports packaging's
    specifiers itself.)"""
    code = (
        "import json, sys\n"
        "import torch, accelerate, accelerate.state, transformers.modeling_utils, peft\n"
        "heavy = ('pluggy', 'accelreg.types', 'accelreg.registry.snapshot', 'accelreg.queries',\n"
        "         'accelreg.placement', 'packaging.specifiers')\n"
        "theirs = {m for m in heavy if m in sys.modules}\n"
        "import accelreg\naccelreg.install()\n"
        "before = sorted(m for m in heavy if m in sys.modules and m not in theirs)\n"
        "from accelreg.integrations import status\n"
        "on = sorted(i['name'] for i in status() if i['enabled'])\n"
        "device = str(accelreg.resolve())\n"
        "print(json.dumps([before, on, device, 'pluggy' in sys.modules]))\n"
    )
    before, on, device, pluggy_after = run_python(code, name=None).value
    assert before == [], before
    assert {"accelerate", "transformers", "peft", "torch_accelerator"} <= set(on), on
    assert device == "cpu" and pluggy_after


@pytest.mark.parametrize("row", table.ROWS, ids=lambda r: r.name)
def test_each_row_is_the_data_of_its_folders_integration(row: table.Row) -> None:
    """The row (read without importing anything) and the ``INTEGRATION`` its folder builds agree,
    so ``install()``'s conflict report from the row is the integration's."""
    integ = table.load_builtin(row)
    assert integ.name == row.name and integ.trigger == row.trigger
    assert str(integ.releases) == str(integrations.Releases(row.releases))
    assert dict(integ.tested) == row.tested and integ.follower == row.follower
    assert integ.distribution in row.distributions
    assert row.module.startswith("accelreg.integrations.") and row.module.split(".")[2] in {
        "accelerate",
        "transformers",
        "peft",
        "deepspeed",
        "ray",
        "lightning",
        "vllm",
        "torch",
        "safetensors",
    }
    if row.early is not None:
        _watched, function = row.early
        assert callable(getattr(importlib.import_module(row.module), function)), row.early


def test_every_seam_is_served_over_its_whole_window() -> None:
    """What used to be checked in each process (a seam none of whose adapters serves the
    installed release, inside the window) is checked here, once, for every minor release of
    every row: ``install()`` then reports only a release outside a row's range."""
    gaps = []
    for row in table.ROWS:
        integ = table.load_builtin(row)
        for minor in integ.window.minors():
            release = f"{minor}.0" if f"{minor}.0" in integ.window else f"{minor}.99"
            if release not in integ.window:
                continue
            gaps += [f"{row.name} {release}: {c}" for c in integ.conflicts(release)]
    assert gaps == []


def _old_paths() -> list[object]:
    """Every old path; vLLM's own modules import vLLM (only ``nox -s vllm``'s layer has it)."""
    vllm = importlib.util.find_spec("vllm") is not None
    return [
        pytest.param(
            old,
            marks=pytest.mark.skip(reason="imports vllm, which only nox -s vllm's layer installs"),
        )
        if old.startswith("vllm_") and not vllm
        else old
        for old in sorted(_moved.MOVED)
    ]


@pytest.mark.parametrize("old", _old_paths())
def test_an_old_module_path_is_the_new_module_with_a_deprecation_warning(old: str) -> None:
    new, deprecated = _moved.MOVED[old]
    name = f"accelreg.integrations.{old}"
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    assert module is importlib.import_module(f"accelreg.integrations.{new}")
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning) and name in str(w.message)]
    if deprecated:
        assert len(moved) == 1 and f"accelreg.integrations.{new}" in str(moved[0].message)
        assert _moved.REMOVED_IN in str(moved[0].message)
    else:
        assert moved == []


def test_the_old_paths_users_reach_still_serve_what_they_served() -> None:
    """DeepSpeed's route and the Lightning accelerator's import path (docs named both)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from accelreg.integrations import ds_accelerator, lightning_accelerator, torch_accelerator
    assert callable(ds_accelerator.registry_accelerator) and callable(ds_accelerator.accelerator_for)
    assert lightning_accelerator.RegistryAccelerator is integrations.lightning.RegistryAccelerator
    assert torch_accelerator.INTEGRATION is table.integration("torch_accelerator")


def test_the_shared_shapes_are_served_from_the_face() -> None:
    from accelreg.integrations._machinery import releases, seams

    assert integrations.Integration is seams.Integration and integrations.Seam is seams.Seam
    assert integrations.Adapter is seams.Adapter and integrations.Releases is releases.Releases
    assert integrations.IntegrationWarning is seams.IntegrationWarning
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        integrations.nothing_here  # noqa: B018
