"""safetensors through accelreg's integration, against the real library, in this process (no
emulator: tests/emu/test_safetensors_devices.py loads onto the emulated devices).

* Which devices the release takes is asked of the release (a tiny file), and remembered.
* What the release takes, an int, another framework and a device type no backend declares go
  to safetensors untouched; its own handle comes back.
* A registry backend's device type the release refuses: resolved by the registry (a
  ``DeviceError`` naming the devices for a bad index), opened on the cpu, each tensor moved as it
  is read (to ``meta`` here, a device type torch moves to without a runtime), its mapped pages
  given back, the data intact when read again; no method that would hand out cpu tensors.
* ``load_file`` and ``load_model`` reach the seam through ``safetensors.torch``'s namespace.
"""

from __future__ import annotations

import sys

import pytest
import torch

import accelreg
import accelreg.integrations as integrations
from accelreg.errors import DeviceError
from accelreg.integrations.safetensors import accepts as _accepts
from accelreg.integrations.safetensors.on_device import OnDevice
from accelreg.integrations.safetensors.pages import Mapping

from ..._fakes import plugin, spec
from .._support import _module

#: A device type torch knows (``torch.device("maia", 0)`` is valid without a runtime) and no
#: served safetensors release lists, for a fake backend.
REFUSED_TYPE = "maia"


@pytest.fixture
def st_file(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    tensors = {
        "big": torch.randn(256, 1024),  # 1 MiB: whole pages to give back
        "small": torch.arange(10, dtype=torch.int64),
        "half": torch.randn(33, 7).to(torch.bfloat16),
    }
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.fixture
def refused_backend():
    """A registry backend whose device type the release refuses, with two devices."""
    accelreg.register(plugin(spec("acme", 2, priority=100, device_type=REFUSED_TYPE)), "fakeplugin_acme")
    _accepts.forget()
    yield
    accelreg.reset()
    _accepts.forget()


def _release_opener():
    import safetensors

    from accelreg.integrations import original

    return original(safetensors.safe_open)


def test_the_release_is_asked_which_devices_it_takes_and_the_answer_is_kept(monkeypatch):
    import safetensors

    opener = _release_opener()
    opened = []

    def open_with(o, path, device):
        opened.append(device)
        return o(path, "pt", device=device)

    _accepts.forget()
    assert _accepts.accepts(opener, "cpu", open_with) is True
    assert _accepts.accepts(opener, "npu:0", open_with) is True  # every served release lists npu
    assert _accepts.accepts(opener, "sdaa:0", open_with) is False  # none lists sdaa
    assert _accepts.accepts(opener, "sdaa:0", open_with) is False
    assert opened == ["cpu", "npu:0", "sdaa:0"]  # the second question is answered from memory
    with pytest.raises(safetensors.SafetensorError, match="sdaa:0 is invalid"):
        opener(__file__, "pt", device="sdaa:0")  # what the probe saw, from the release itself


def test_no_probe_file_means_the_call_goes_to_safetensors(monkeypatch):
    def no_tmp(*args, **kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr(_accepts.tempfile, "mkstemp", no_tmp)
    _accepts.forget()
    assert _accepts.accepts(_release_opener(), "sdaa:0", lambda *a: pytest.fail("opened")) is True


def test_what_the_release_takes_goes_to_it_untouched(st_file, refused_backend):
    import safetensors
    import safetensors.torch

    path, tensors = st_file
    opener = _release_opener()
    with _module("safetensors").enabled():
        assert safetensors.safe_open is not opener and safetensors.torch.safe_open is safetensors.safe_open
        with safetensors.safe_open(str(path), framework="pt", device="cpu") as f:
            assert type(f) is opener
            assert torch.equal(f.get_tensor("big"), tensors["big"])
        # opened by the release (reading would need that runtime): npu, which every served release
        # lists, and 0, safetensors' cuda index, never reinterpreted
        for device in ("npu:0", 0):
            with safetensors.safe_open(str(path), framework="pt", device=device) as f:
                assert type(f) is opener
        with safetensors.safe_open(str(path), framework="numpy") as f:  # another framework
            assert type(f) is opener
        with pytest.raises(safetensors.SafetensorError, match="device bogus:0 is invalid"):
            safetensors.safe_open(str(path), framework="pt", device="bogus:0")  # no backend's type


def test_a_refused_registry_device_opens_on_the_cpu_and_moves_each_tensor(st_file, refused_backend):
    import safetensors
    from safetensors.torch import load_file

    path, tensors = st_file
    with _module("safetensors").enabled():
        with safetensors.safe_open(str(path), framework="pt", device=f"{REFUSED_TYPE}:1") as f:
            assert isinstance(f, OnDevice) and f.device == torch.device(REFUSED_TYPE, 1)
            assert sorted(f.keys()) == sorted(tensors) and f.metadata() is None
            # the move itself needs the runtime; the handle is the cpu one, read through it
            assert f._handle.get_tensor("small").tolist() == list(range(10))
            with pytest.raises(AttributeError, match=rf"not available .* for {REFUSED_TYPE}:1"):
                f.get_tensor_bytes  # noqa: B018 - a method accelreg does not know: never cpu tensors
        with pytest.raises(DeviceError, match=r"is out of range: acme has 2 devices \(maia:0, maia:1\)"):
            load_file(str(path), device=f"{REFUSED_TYPE}:5")
        with pytest.raises(DeviceError):
            load_file(str(path), device=torch.device(REFUSED_TYPE, 7))


def test_each_tensor_arrives_on_the_device_and_its_pages_are_given_back(st_file):
    import safetensors

    from accelreg.integrations import original

    path, tensors = st_file
    cpu = original(safetensors.safe_open)(str(path), framework="pt", device="cpu")
    handle = OnDevice(cpu, torch.device("meta"), str(path))
    given: list[int] = []

    class Recording(Mapping):
        def release(self, tensor):
            given.append(super().release(tensor))
            return given[-1]

    handle._mapping = Recording(str(path))
    moved = handle.get_tensor("big")
    assert moved.device.type == "meta" and moved.shape == tensors["big"].shape
    sliced = handle.get_slice("half")[1:4]
    assert sliced.device.type == "meta" and sliced.shape == (3, 7) and sliced.dtype == torch.bfloat16
    assert handle.get_slice("half").get_shape() == [33, 7]
    if hasattr(cpu, "get_tensors"):  # 0.8: every tensor, one at a time, in file order
        assert {k: v.device.type for k, v in handle.get_tensors().items()} == dict.fromkeys(tensors, "meta")
    if sys.platform.startswith("linux"):
        assert given[0] >= (1 << 20) - 2 * 4096  # the big tensor's whole pages
    # given back pages are read again from the file: nothing is lost
    assert torch.equal(cpu.get_tensor("big"), tensors["big"])


def test_a_tensor_outside_the_files_mapping_is_left_alone(st_file):
    path, _ = st_file
    own = torch.ones(1 << 20, dtype=torch.uint8)
    assert Mapping(str(path)).release(own) == 0
    assert bool(own.all())


def test_load_file_and_load_model_reach_the_seam_through_safetensors_torch():
    """Every served release's ``load_file`` calls ``safe_open`` from ``safetensors.torch``'s
    namespace and ``load_model`` calls ``load_file``: the holder the seam patches."""
    import safetensors.torch

    assert "safe_open" in safetensors.torch.load_file.__code__.co_names
    assert "load_file" in safetensors.torch.load_model.__code__.co_names
    with _module("safetensors").enabled():
        assert integrations.original(safetensors.torch.safe_open) is _release_opener()


def test_status_shows_the_row_with_every_seam_matched():
    [item] = [i for i in integrations.status() if i["name"] == "safetensors"]
    assert item["library"] == "safetensors" and item["in_range"] is True and item["all_match"] is True
    assert item["trigger"] == "safetensors" and str(item["releases"]) == ">=0.4.3,<0.9"
    assert [s["seam"] for s in item["seams"]] == ["safetensors.safe_open", "safetensors._safe_open_handle"]
