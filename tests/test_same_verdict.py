"""Same input, same verdict, on every machine (issue 21): a local rank and a device index are
judged the same way with and without an accelerator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import accelreg
from accelreg import DeviceError
from accelreg.testing import clean_environ

from ._fakes import plugin, spec


@pytest.fixture(params=["cpu only", "8 cuda devices"])
def machine(request, monkeypatch):
    """This machine as it is (cpu only), or with a scripted 8-device accelerator."""

    def install() -> str:
        if request.param == "8 cuda devices":
            accelreg.register(plugin(spec("cuda", 8, priority=100)), "fakeplugin_cuda8")
            return "cuda"
        return "cpu"

    return install


def _resolve_with(monkeypatch, machine, **env: str) -> str:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    accelreg.reset()
    machine()
    return str(accelreg.resolve())


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "", " 0x1"])
def test_a_malformed_local_rank_is_an_error_everywhere(monkeypatch, machine, value):
    if value == "":
        assert _resolve_with(monkeypatch, machine, LOCAL_RANK=value) in ("cpu", "cuda:0")  # unset
        return
    with pytest.raises(DeviceError, match="is not a valid local rank"):
        _resolve_with(monkeypatch, machine, LOCAL_RANK=value)


def test_a_rank_no_launcher_accounts_for_is_an_error_everywhere(monkeypatch, machine):
    with pytest.raises(DeviceError, match=r"LOCAL_RANK=5, but LOCAL_WORLD_SIZE=2"):
        _resolve_with(monkeypatch, machine, LOCAL_RANK="5", LOCAL_WORLD_SIZE="2")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(DeviceError, match=r"LOCAL_RANK=3, but WORLD_SIZE=2"):
        _resolve_with(monkeypatch, machine, LOCAL_RANK="3", WORLD_SIZE="2", RANK="1")


@pytest.mark.parametrize(
    ("env", "cpu", "cuda"),
    [
        ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}, "cpu", "cuda:5"),  # torchrun
        ({"LOCAL_RANK": "1", "LOCAL_SIZE": "2"}, "cpu", "cuda:1"),  # the DeepSpeed launcher
        ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, "cpu", "cuda:1"),  # accelerate's debug launcher
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, "cpu", "cuda:2"),  # Open MPI
        ({"LOCAL_RANK": "0"}, "cpu", "cuda:0"),
    ],
)
def test_ranks_a_launcher_accounts_for_share_the_cpu_or_get_their_device(monkeypatch, env, cpu, cuda):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    accelreg.reset()
    assert str(accelreg.resolve()) == cpu
    accelreg.register(plugin(spec("cuda", 8, priority=100)), "fakeplugin_cuda8")
    assert str(accelreg.resolve()) == cuda


def test_a_rank_past_zero_without_a_process_count_is_an_error_on_the_cpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(
        DeviceError, match=r"LOCAL_RANK=5, but no accelerator is available here.*LOCAL_WORLD_SIZE"
    ):
        accelreg.resolve()
    with pytest.raises(DeviceError, match="LOCAL_RANK=5"):
        accelreg.resolve("auto")
    # on an accelerator the device count judges it: 8 devices have a device 5, 2 do not
    accelreg.register(plugin(spec("cuda", 8, priority=100)), "fakeplugin_cuda8")
    assert accelreg.resolve() == torch.device("cuda", 5)
    accelreg.reset()
    accelreg.register(plugin(spec("cuda", 2, priority=100)), "fakeplugin_cuda2")
    with pytest.raises(DeviceError, match="LOCAL_RANK=5, but cuda has 2 devices"):
        accelreg.resolve()


def test_an_explicit_cpu_is_not_judged_by_the_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "x")
    assert accelreg.resolve("cpu") == torch.device("cpu")


@pytest.mark.parametrize("index", [-1, -7])
def test_a_negative_index_is_named_negative_everywhere(machine, index):
    machine()
    with pytest.raises(DeviceError, match=rf"device index {index} is negative"):
        accelreg.resolve(index)


def test_accelreg_resolve_minus_one_says_the_index_is_negative(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "accelreg", "resolve", "-1", "--json"],
        capture_output=True,
        text=True,
        env=clean_environ(),
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["error"] == "device index -1 is negative; device indices start at 0"
