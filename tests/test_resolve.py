"""resolve() semantics: the contract in docs/api.md (and the design brief it comes from), on this CPU
machine and on scripted backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import accelreg
from accelreg import DeviceError

from ._fakes import plugin, spec


def test_cpu_machine_auto_is_cpu():
    assert accelreg.resolve() == torch.device("cpu")
    assert accelreg.resolve("auto") == torch.device("cpu")
    assert accelreg.current_backend().name == "cpu"


def test_int_without_accelerator_is_an_error_not_cpu():
    with pytest.raises(DeviceError, match=r"no accelerator is available.*available: cpu"):
        accelreg.resolve(0)


@pytest.mark.parametrize("text", ["cpu", "cpu:0"])
def test_cpu_passes_through(text):
    assert accelreg.resolve(text) == torch.device("cpu")


def test_meta_passes_through_and_disk_is_map_only():
    assert accelreg.resolve("meta") == torch.device("meta")
    with pytest.raises(DeviceError, match="only as a device-map value"):
        accelreg.resolve("disk")


def test_unavailable_builtin_names_its_reason():
    with pytest.raises(
        DeviceError, match=r"npu is not available \(torch_npu is not installed\); available: cpu"
    ):
        accelreg.resolve("npu:0")
    with pytest.raises(DeviceError, match="was built without CUDA"):
        accelreg.resolve(torch.device("cuda", 0))


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("bogus", "unknown device 'bogus'"),
        ("CPU", "lower case"),
        (" cpu", "whitespace"),
        ("npu:", "malformed"),
        ("npu:-1", "malformed"),
        ("npu:1:2", "malformed"),
        ("", "empty string"),
        ("auto:0", "takes no index"),
        ("cpu:1", "one device"),
    ],
)
def test_bad_strings(bad, match):
    with pytest.raises(DeviceError, match=match):
        accelreg.resolve(bad)


@pytest.mark.parametrize("bad", [True, False, 1.0, 0.0, 1 + 0j, b"cpu", ["cpu"], {"": 0}, object()])
def test_wrong_types_raise_type_error(bad):
    with pytest.raises(TypeError):
        accelreg.resolve(bad)


@pytest.fixture
def two_cuda():
    accelreg.register(plugin(spec("cuda", 2, priority=100)), "fakeplugin_cuda")


def test_index_on_current_backend(two_cuda):
    assert accelreg.resolve() == torch.device("cuda", 0)
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    assert accelreg.resolve(np.int64(1)) == torch.device("cuda", 1)
    assert accelreg.resolve("cuda") == torch.device("cuda", 0)
    assert accelreg.resolve(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert accelreg.device_count() == 2


def test_out_of_range_message_names_devices(two_cuda):
    with pytest.raises(DeviceError) as err:
        accelreg.resolve("cuda:3")
    assert str(err.value) == '"cuda:3" is out of range: cuda has 2 devices (cuda:0, cuda:1)'
    with pytest.raises(DeviceError, match="negative"):
        accelreg.resolve(-1)
    with pytest.raises(DeviceError, match="out of range"):
        accelreg.resolve(2)


def test_cache_never_confuses_equal_values_of_other_types(two_cuda):
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    assert accelreg.resolve(1) == torch.device("cuda", 1)  # cached
    for bad in (True, 1.0, 1 + 0j):
        with pytest.raises(TypeError):
            accelreg.resolve(bad)


def test_local_rank_picks_the_device(two_cuda, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("cuda", 2, priority=100)), "fakeplugin_cuda")
    assert accelreg.resolve() == torch.device("cuda", 1)
    assert accelreg.resolve("cuda") == torch.device("cuda", 1)
    assert accelreg.resolve(0) == torch.device("cuda", 0)  # an explicit index is not overridden


@pytest.mark.parametrize(
    ("value", "match"),
    [("2", "LOCAL_RANK=2, but cuda has 2 devices"), ("x", "not a valid"), ("-1", "not a valid")],
)
def test_bad_local_rank_is_an_error_not_device_0(monkeypatch, value, match):
    monkeypatch.setenv("LOCAL_RANK", value)
    accelreg.register(plugin(spec("cuda", 2, priority=100)), "fakeplugin_cuda")
    with pytest.raises(DeviceError, match=match):
        accelreg.resolve()


def test_local_rank_without_accelerator_needs_a_launcher_that_accounts_for_it(monkeypatch):
    """Issue 21: a rank no launcher accounts for is an error on the cpu as on an accelerator;
    every rank of a CPU-only job (LOCAL_WORLD_SIZE set) shares the cpu (tests/test_same_verdict.py)."""
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(DeviceError, match="LOCAL_RANK=5, but no accelerator is available here"):
        accelreg.resolve()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    accelreg.reset()
    assert accelreg.resolve() == torch.device("cpu")


def test_current_index_used_without_local_rank():
    accelreg.register(plugin(spec("cuda", 2, priority=100, current=1)), "fakeplugin_cuda")
    assert accelreg.resolve() == torch.device("cuda", 1)


def test_unindexed_backend():
    hpu = spec("hpu", 1, priority=40, indexed=False, device=lambda i: torch.device("hpu"))
    accelreg.register(plugin(hpu), "fakeplugin_hpu")
    assert accelreg.resolve() == torch.device("hpu")
    assert accelreg.resolve(0) == torch.device("hpu")
    assert accelreg.resolve("hpu") == torch.device("hpu")
    with pytest.raises(DeviceError, match="out of range"):
        accelreg.resolve(1)


def test_backend_argument(two_cuda):
    accelreg.register(plugin(spec("xpu", 1, priority=90)), "fakeplugin_xpu")
    assert accelreg.resolve(0, backend="xpu") == torch.device("xpu", 0)
    assert accelreg.resolve(None, backend="xpu") == torch.device("xpu", 0)
    with pytest.raises(DeviceError, match="out of range: xpu has 1 device"):
        accelreg.resolve(1, backend="xpu")
    with pytest.raises(DeviceError, match="is not a xpu device"):
        accelreg.resolve("cuda:0", backend="xpu")
    with pytest.raises(DeviceError, match="unknown backend 'nope'"):
        accelreg.resolve(0, backend="nope")
    with pytest.raises(DeviceError, match="npu is not available"):
        accelreg.resolve(0, backend="npu")


def test_plugin_device_mapping_is_checked():
    liar = spec("cuda", 2, priority=100, device=lambda i: torch.device("cpu"))
    accelreg.register(plugin(liar), "fakeplugin_liar")
    with pytest.raises(DeviceError, match="not a cuda device"):
        accelreg.resolve(0)


def test_registered_but_unknown_to_torch_is_a_clear_error():
    accelreg.register(plugin(spec("npu", 2, priority=100)), "fakeplugin_npu")
    with pytest.raises(DeviceError, match="torch does not know device type 'npu'"):
        accelreg.resolve(0)


def test_device_count_by_name(two_cuda):
    assert accelreg.device_count("cuda") == 2
    assert accelreg.device_count("npu") == 0
    assert accelreg.device_count("cpu") == 1
    with pytest.raises(DeviceError, match="unknown backend"):
        accelreg.device_count("nope")
    with pytest.raises(TypeError):
        accelreg.device_count(0)
