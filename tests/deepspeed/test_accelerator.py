"""DeepSpeed's accelerator agrees with the registry (``_accel_checks.py``, one process)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import HERE

pytestmark = pytest.mark.slow

CHECKS = re.findall(r"^def (check_\w+)\(", (HERE / "_accel_checks.py").read_text(), re.MULTILINE)


@pytest.mark.parametrize("name", CHECKS)
def test_accelerator(ds_helpers: Any, name: str) -> None:
    run = ds_helpers.accelerator()
    run.done()
    found = [r for r in run.records if r.get("check") == name]
    assert found, f"{name} did not run\n{run.describe()}"
    assert found[0]["ok"], found[0]["error"]
