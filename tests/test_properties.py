"""Property-based: no generated bad input to resolve() ever returns a device."""

from __future__ import annotations

import string

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accelreg
from accelreg import DeviceError

from ._fakes import plugin, spec

VALID_ON_TWO = {"cuda:0", "cuda:1", "cuda", "cpu", "cpu:0", "meta", "meta:0", "auto"}


def _setup():
    accelreg.reset()
    accelreg.register(plugin(spec("cuda", 2, priority=100)), "fakeplugin_prop")


junk_strings = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=string.ascii_letters + string.digits + ":-_ .", max_size=12),
    st.builds(
        lambda n, i: f"{n}:{i}",
        st.sampled_from(["cuda", "npu", "cpu", "xpu", "disk", "CUDA", "meta"]),
        st.integers(-5, 10**12),
    ),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=junk_strings)
def test_strings_resolve_or_raise_device_error(text):
    _setup()
    try:
        device = accelreg.resolve(text)
    except DeviceError:
        assert text not in VALID_ON_TWO
        return
    # Whatever resolves must be a device that exists here, named as asked.
    assert text in VALID_ON_TWO or text.startswith("cuda:")
    assert device.type in ("cuda", "cpu", "meta")
    if device.type == "cuda":
        assert device.index in (0, 1)
        if ":" in text:
            assert device.index == int(text.split(":")[1])


@settings(max_examples=300, deadline=None)
@given(index=st.integers(min_value=-(10**20), max_value=10**20))
def test_ints_out_of_range_never_return(index):
    _setup()
    if 0 <= index < 2:
        assert accelreg.resolve(index) == torch.device("cuda", index)
    else:
        with pytest.raises(DeviceError):
            accelreg.resolve(index)


wrong_types = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True),
    st.complex_numbers(),
    st.binary(max_size=4),
    st.lists(st.integers(0, 1), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(0, 1), max_size=1),
    st.tuples(st.text(max_size=3), st.integers(0, 1)),
    st.just(object()),
    st.just(Ellipsis),
)


@settings(max_examples=300, deadline=None)
@given(value=wrong_types)
def test_wrong_types_raise_type_error(value):
    _setup()
    with pytest.raises(TypeError):
        accelreg.resolve(value)
