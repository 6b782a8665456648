"""torch.accelerator follows the registry under ``install()`` (issue 28), on the emulated npu:
torch's own answer is whatever runtime registered itself with torch (the emulator, through
``torch_npu``); the registry's is what accelreg's configuration makes of the backends. Where
they disagree — npu disabled in accelreg, masked away, or another backend ranked first —
``torch.accelerator.current_accelerator()`` (and ``device_count()``/``is_available()``, which
call it) answers the registry's backend, and ``accelreg env`` says that they disagree and why.

All in one child process with the emulator as npu x 2 (the ``accelreg_emu`` marker); each test
starts from a fresh registry (``accelreg_fresh``), the integration off.
"""

from __future__ import annotations

import importlib
import io
import json
from contextlib import redirect_stdout

import pytest
import torch

import accelreg
from accelreg.cli import main
from accelreg.integrations import torch as torch_accelerator
from accelreg.launch.startup import watched
from accelreg.types import BackendSpec

from ..test_schemas import check

pytestmark = [pytest.mark.emu, pytest.mark.accelreg_emu(name="npu", devices=2)]

NPU = "npu"  # compared by type: torch.device("npu") exists only once the runtime renamed PrivateUse1


@pytest.fixture(autouse=True)
def runtime_up():
    """torch_npu imported, as a library does (the emulator registers itself with torch); the
    integration on for the test, as install() leaves it."""
    importlib.import_module("torch_npu")
    torch_accelerator.enable()
    yield
    torch_accelerator.disable()


def _answers() -> tuple[object, int, bool]:
    acc = torch.accelerator
    current = acc.current_accelerator()
    return (None if current is None else current.type), acc.device_count(), acc.is_available()


def test_they_agree_on_an_npu_node_and_the_answer_is_torchs():
    assert _answers() == (NPU, 2, True)
    item = torch_accelerator.report()
    assert item["agree"] and item["torch"] == item["registry_device_type"] == "npu", item


def test_a_backend_disabled_in_accelreg_is_no_accelerator_to_torch_accelerator():
    accelreg.configure(disable=["npu"])
    assert _answers() == (None, 0, False)
    assert torch.accelerator.current_accelerator(check_available=True) is None
    item = torch_accelerator.report()
    assert not item["agree"] and item["torch"] == "npu" and item["registry"] == "cpu", item
    assert "npu is disabled by argument" in item["why"] and item["under_install"] is None, item
    torch_accelerator.disable()
    assert _answers() == (NPU, 2, True), "disable() gives torch.accelerator back its own answers"


def test_a_backend_masked_away_is_no_accelerator_either(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")  # the registry reads it at its next build
    accelreg.reset()
    assert _answers()[0] is None and accelreg.resolve() == torch.device("cpu")
    assert "npu is unavailable to the registry" in torch_accelerator.report()["why"]


def test_a_backend_ranked_first_wins_over_torchs_runtime():
    """A second backend the registry ranks first (a scripted one on the device type ``xpu``,
    whose device module every torch build has): torch.accelerator answers it, as the registry
    does."""
    plugin = type("P", (), {})()
    plugin.accelreg_backends = accelreg.hookimpl(
        lambda: [
            BackendSpec(
                name="acme", priority=99, is_available=lambda: True, device_count=lambda: 1, device_type="xpu"
            )
        ]
    )
    accelreg.register(plugin, name="acme")
    assert torch.accelerator.current_accelerator() == torch.device("xpu")
    item = torch_accelerator.report()
    assert not item["agree"] and "npu is available but ranked after acme" in item["why"], item


def test_a_probe_that_asks_torch_accelerator_gets_torchs_own_answer():
    """Plugin code runs contained, and a registry query from it fails the plugin; torch code a
    probe calls while bringing a runtime up may ask torch.accelerator, which must then answer
    by itself instead of querying accelreg."""
    seen = []

    def available() -> bool:
        seen.append(torch.accelerator.current_accelerator())
        return False

    plugin = type("P", (), {})()
    plugin.accelreg_backends = accelreg.hookimpl(
        lambda: [BackendSpec(name="acme", priority=1, is_available=available, device_count=lambda: 0)]
    )
    accelreg.register(plugin, name="acme")
    accelreg.backends()
    assert [d.type for d in seen] == [NPU] and not accelreg.failures(), accelreg.failures()


def test_install_enables_it_and_uninstall_restores_torch():
    torch_accelerator.disable()
    upstream = torch.accelerator.current_accelerator
    assert "torch_accelerator" in accelreg.install()
    assert torch_accelerator.INTEGRATION.enabled and torch.accelerator.current_accelerator is not upstream
    accelreg.integrations.uninstall()
    assert torch.accelerator.current_accelerator is upstream


def test_torch_alone_does_not_start_install_at_interpreter_start_up():
    """Every job process imports torch; only a host library's import runs install()."""
    assert "torch" not in watched() and "torch.accelerator" not in watched()
    assert "accelerate" in watched()


def test_accelreg_env_says_they_disagree_and_why():
    accelreg.configure(disable=["npu"])
    out = io.StringIO()
    with redirect_stdout(out):
        main(["env"])
    text = out.getvalue()
    assert "torch.accelerator: DISAGREES with the registry: torch.accelerator answers npu" in text, text
    assert "npu is disabled by argument" in text and "no accelerator" in text, text
    out = io.StringIO()
    with redirect_stdout(out):
        main(["env", "--json"])
    data = json.loads(out.getvalue())
    check("env", data)
    assert data["torch_accelerator"]["agree"] is False and data["torch_accelerator"]["torch"] == "npu"
