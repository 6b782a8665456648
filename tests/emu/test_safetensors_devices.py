"""safetensors onto every registry device, through the seam at the callee (issue 42).

safetensors' Rust core refuses a device string outside its own list (``sdaa``, and ``emu``, the
emulator's own name, in every release; ``mlu``, ``hpu`` and ``musa`` in older ones). With
``accelreg.install()`` each way a user or a library hands it a device works on such a device, with
the same tensors as on ``npu`` — a device the release takes, whose calls stay safetensors' own —
and as on the cpu. The workflows (``_safetensors_loads.py``) run in one child per emulated name:
``safe_open``/``get_slice``/``load_file``/``load_model``/``_safe_open_handle``, peft's
``PeftModel.from_pretrained`` with and without ``low_cpu_mem_usage``, accelerate's
``load_checkpoint_and_dispatch`` with a map naming the device, and accelerate's ``load_state``
onto the device (which the accelerate integration no longer seams: the callee's seam answers it).
The default run covers ``emu``; ``sdaa``, ``mlu``, ``musa`` and ``hpu`` (which older releases refuse,
and 0.8 takes) are in the slow group. The release matrix runs this file
against the oldest and newest served safetensors (noxfile.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from accelreg.testing import run_python

from .._matrix import emu_names

pytestmark = pytest.mark.emu

HELPER = Path(__file__).with_name("_safetensors_loads.py")

#: The workflows whose tensors are compared (each has a cpu twin under ``cpu/``).
WORKFLOWS = {
    "safe_open": ("safe_open", "slice", "safe_open_handle"),
    "load_file": ("load_file", "load_model"),
    "peft": (
        "peft_low_cpu_mem_usage_False",
        "peft_low_cpu_mem_usage_False_forward",
        "peft_low_cpu_mem_usage_True",
        "peft_low_cpu_mem_usage_True_forward",
    ),
    "dispatch": ("dispatch_one", "dispatch_one_forward", "dispatch_split", "dispatch_split_forward"),
    "load_state": ("load_state",),
}


class Loaded:
    """What the helper loaded under one emulated name: the tensors (on the cpu) and what it saw."""

    def __init__(self, name: str, folder: Path) -> None:
        from safetensors.torch import load_file

        code = (
            "import runpy, sys\n"
            f"sys.argv = [{str(HELPER)!r}, {str(folder)!r}]\n"
            f"runpy.run_path({str(HELPER)!r}, run_name='__main__')\n"
        )
        result = run_python(code, name=name, devices=2, timeout=600, env={"TQDM_DISABLE": "1"})
        self.name = name
        self.seen: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        self.tensors = load_file(str(folder / "results.safetensors"))

    def of(self, workflow: str) -> dict[str, torch.Tensor]:
        prefix = f"{workflow}/"
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def _run(name: str, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return Loaded(name, tmp_path_factory.mktemp(f"safetensors-{name}"))


@pytest.fixture(scope="module")
def on_npu(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    """The reference: ``npu``, a device type every served release takes (untouched by the seam)."""
    return _run("npu", tmp_path_factory)


@pytest.fixture(scope="module", params=emu_names(("emu", "sdaa", "mlu", "musa", "hpu")))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return _run(request.param, tmp_path_factory)


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys() and got, (what, sorted(got), sorted(want))
    for key, tensor in got.items():
        assert tensor.dtype == want[key].dtype and torch.equal(tensor, want[key]), (what, key)


def _check(loaded: Loaded, on_npu: Loaded, workflows: tuple[str, ...]) -> None:
    present = [w for w in workflows if w in on_npu.seen]  # _safe_open_handle: 0.6 and later
    assert present, workflows
    for workflow in present:
        _same(loaded.of(workflow), on_npu.of(workflow), f"{workflow} on {loaded.name} vs npu")
        _same(
            loaded.of(workflow), loaded.of(f"cpu/{workflow}"), f"{workflow} on {loaded.name} vs its cpu run"
        )


def test_a_device_the_release_refuses_goes_through_the_cpu_and_one_it_takes_is_untouched(
    loaded: Loaded, on_npu: Loaded
) -> None:
    """The canary (integration off): every served release refuses ``emu`` and ``sdaa`` ("upstream
    changed" when it stops); ``mlu``, ``hpu`` and ``musa`` depend on the release. A device the
    release takes (``npu``, always) gets the release's own handle: the seam hands the call on
    untouched; one it refuses is opened on the cpu, each tensor moved as it is read."""
    stock = loaded.seen["stock"]
    refused = (
        stock.startswith("SafetensorError") and f"device {loaded.name}" in stock and "is invalid" in stock
    )
    if loaded.name in ("emu", "sdaa"):
        assert refused, (
            f"upstream changed: safetensors {loaded.seen['safetensors']} loads onto {loaded.name} by itself: {stock}"
        )
    assert refused or stock == "loaded", stock
    assert loaded.seen["handle"] == ("OnDevice" if refused else "safe_open"), (stock, loaded.seen["handle"])
    assert on_npu.seen["stock"] == "loaded"
    assert on_npu.seen["handle"] == "safe_open"  # the release's own handle


def test_safe_open_get_slice_and_the_file_handle_on_the_device_equal_npu(
    loaded: Loaded, on_npu: Loaded
) -> None:
    for workflow in WORKFLOWS["safe_open"]:
        if workflow in loaded.seen:
            assert loaded.seen[workflow] == [loaded.seen["device_1"]], (workflow, loaded.seen[workflow])
    _check(loaded, on_npu, WORKFLOWS["safe_open"])


def test_load_file_and_load_model_on_the_device_equal_npu(loaded: Loaded, on_npu: Loaded) -> None:
    for workflow in WORKFLOWS["load_file"]:
        assert loaded.seen[workflow] == [loaded.seen["device_1"]], (workflow, loaded.seen[workflow])
    _check(loaded, on_npu, WORKFLOWS["load_file"])


@pytest.mark.parametrize("low_cpu_mem_usage", [False, True])
def test_peft_from_pretrained_onto_a_model_on_the_device_equals_npu(
    loaded: Loaded, on_npu: Loaded, low_cpu_mem_usage: bool
) -> None:
    """peft loads the adapter with ``load_file(..., device=<the device type>)`` and moves each
    adapter to its base layer's device (index 1); the forward output matches npu's exactly."""
    workflow = f"peft_low_cpu_mem_usage_{low_cpu_mem_usage}"
    assert loaded.seen[workflow] == [loaded.seen["device_1"]], loaded.seen[workflow]
    _check(loaded, on_npu, (workflow, f"{workflow}_forward"))


def test_load_checkpoint_and_dispatch_with_a_map_naming_the_device_equals_npu(
    loaded: Loaded, on_npu: Loaded
) -> None:
    assert loaded.seen["dispatch_one"] == [loaded.seen["device_1"]]
    assert loaded.seen["dispatch_split"] == sorted({loaded.seen["device_0"], loaded.seen["device_1"]})
    _check(loaded, on_npu, WORKFLOWS["dispatch"])


def test_accelerate_load_state_onto_the_device_equals_npu(loaded: Loaded, on_npu: Loaded) -> None:
    """``load_state(map_location="on_device")`` (what a multi-process rank does) loads the model
    states with safetensors' ``load_model(..., device=<the rank's device>)``."""
    assert loaded.seen["load_state"] == [loaded.seen["device_0"]]
    _check(loaded, on_npu, WORKFLOWS["load_state"])
