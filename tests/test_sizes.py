"""accelreg.sizes: strict parsing of memory sizes, and formatting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelreg.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GiB", 20 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5 GB", 1_500_000_000),
        ("1024", 1024),
        ("7B", 7),
        (" 64 gib ", 64 * 2**30),
        ("2.3MB", 2_300_000),
        ("1e3KB", 10**6),
        ("0.5KiB", 512),
        (".5MiB", 2**19),
        ("1TB", 10**12),
        (12, 12),
        (3.9, 3),
        (0, 0),
    ],
)
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("-1GB", "never negative"),
        (-3, "negative"),
        ("", "not a size"),
        ("lots", "not a size"),
        ("1.2.3GB", "not a size"),
        ("5XB", "unknown unit 'XB'"),
        ("5Gb", "ambiguous"),
        ("500mb", "ambiguous"),
        ("inf", "not a size"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("1e400GB", "out of range"),
    ],
)
def test_bad_sizes_are_rejected_with_the_value_named(value, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_size(value, what="max_memory['npu:0']")
    assert "max_memory['npu:0']" in str(info.value)


@pytest.mark.parametrize("value", [True, None, [1], b"1GB"])
def test_wrong_types_are_type_errors(value):
    with pytest.raises(TypeError):
        parse_size(value)


@given(st.integers(0, 2**60))
def test_ints_and_their_decimal_strings_agree(n):
    assert parse_size(n) == parse_size(str(n)) == parse_size(f"{n} B") == n


@given(st.integers(0, 10**6), st.sampled_from(["KB", "MB", "GB", "KiB", "MiB", "GiB"]))
def test_units_multiply_exactly(n, unit):
    factor = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    assert parse_size(f"{n}{unit}") == n * factor
    assert parse_size(f"{n}.5{unit}") == n * factor + factor // 2


def test_format_size():
    assert format_size(0) == "0 B"
    assert format_size(999) == "999 B"
    assert format_size(60 * 10**6) == "60.0 MB"
    assert format_size(1_500_000_000) == "1.50 GB"
    assert format_size(7 * 2**40, binary=True) == "7.00 TiB"
    assert format_size(-2048, binary=True) == "-2.00 KiB"
