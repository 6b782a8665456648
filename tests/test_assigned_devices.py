"""Devices a scheduler gives a process of its own: ``ACCELREG_DEVICE_ID``, ``registry.refresh()``
and the Ray resource a backend is offered as (``BackendSpec.ray_resource``), on scripted backends.

Ray (through accelreg's Ray integration) sets a task's mask to its own device ids and
``ACCELREG_DEVICE_ID=<backend>=<first id>``; a Ray Train worker's ``LOCAL_RANK`` then counts the
workers on the node, not the devices its mask shows, so the assigned id wins.
"""

from __future__ import annotations

import pytest
import torch

import accelreg
from accelreg import DeviceError, registry
from accelreg.registry import DEVICE_ID_VAR, LAUNCHER_VARS

from ._fakes import plugin, spec

VAR = "ACME_VISIBLE_DEVICES"


def _acme(count: int = 2, **extra) -> None:
    accelreg.register(plugin(spec("cuda", count, priority=100, var=VAR, **extra)), "fakeplugin_assigned")


def test_the_assigned_device_is_its_place_in_the_mask(monkeypatch):
    monkeypatch.setenv(VAR, "5,3")
    monkeypatch.setenv(DEVICE_ID_VAR, "cuda=3")
    monkeypatch.setenv("LOCAL_RANK", "7")  # a Train worker's rank on the node: not an index here
    _acme()
    assert accelreg.resolve() == torch.device("cuda", 1)
    assert accelreg.resolve(0) == torch.device("cuda", 0)  # an explicit index is not overridden


def test_without_a_mask_the_physical_id_is_the_index(monkeypatch):
    monkeypatch.setenv(DEVICE_ID_VAR, "cuda=1")
    _acme()
    assert accelreg.resolve() == torch.device("cuda", 1)


def test_an_id_for_another_backend_leaves_the_local_rank_rule(monkeypatch):
    monkeypatch.setenv(DEVICE_ID_VAR, "npu=0")
    monkeypatch.setenv("LOCAL_RANK", "1")
    _acme()
    assert accelreg.resolve() == torch.device("cuda", 1)


@pytest.mark.parametrize(
    ("mask", "value", "match"),
    [
        ("5,3", "cuda=4", r"does not list device 4"),
        (None, "cuda=2", r"cuda has 2 devices"),
        (None, "cuda", r"not <backend>=<physical device id>"),
        (None, "cuda=GPU-1", r"is not a device index, and ACME_VISIBLE_DEVICES is not set"),
    ],
)
def test_a_wrong_assignment_is_an_error_not_another_device(monkeypatch, mask, value, match):
    if mask is not None:
        monkeypatch.setenv(VAR, mask)
    monkeypatch.setenv(DEVICE_ID_VAR, value)
    _acme()
    with pytest.raises(DeviceError, match=match):
        accelreg.resolve()


def test_an_assigned_device_counts_as_launcher_started():
    """A process a scheduler gave devices never falls back to the cpu silently."""
    assert DEVICE_ID_VAR in LAUNCHER_VARS


def test_refresh_rereads_the_environment_and_keeps_the_configuration(monkeypatch):
    _acme(4, current=0)
    accelreg.configure(cpu_fallback=True)
    assert accelreg.resolve() == torch.device("cuda", 0)
    monkeypatch.setenv(DEVICE_ID_VAR, "cuda=2")
    assert accelreg.resolve() == torch.device("cuda", 0)  # the snapshot was built before
    registry.refresh()
    assert accelreg.resolve() == torch.device("cuda", 2)
    assert registry.get().settings.cpu_fallback is True  # configure() survives a refresh
    assert "cuda" in {b.name for b in accelreg.backends()}  # and so does the registered plugin


def test_ray_resource_defaults_to_the_name_upper_cased_and_the_builtins_use_rays_names():
    snap = registry.get()
    names = {b.name: b.spec.ray_resource_name for b in snap.order}
    assert names["npu"] == "NPU" and names["hpu"] == "HPU" and names["mlu"] == "MLU"
    assert names["cuda"] == "GPU" and names["xpu"] == "GPU"  # Ray's own name for these families
    assert spec("gcu", 1).ray_resource_name == "GCU"
    assert spec("gcu", 1, ray_resource="ENFLAME").ray_resource_name == "ENFLAME"


@pytest.mark.parametrize("bad", ["CPU", "memory", "two words", "x" * 65, 5])
def test_a_ray_resource_ray_cannot_take_is_refused(bad):
    accelreg.register(plugin(spec("acme", 1, device_type="ve", ray_resource=bad)), "fakeplugin_badray")
    assert "acme" not in {b.name for b in accelreg.backends()}
    errors = " | ".join(f.error for f in accelreg.failures())
    assert "ray_resource" in errors, errors
