"""How this suite shares its files among pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from . import conftest

pytest.importorskip("xdist", reason="pytest-xdist is part of the test extra")


class _Config:
    """What the scheduler reads of pytest's config: the mode, the workers, the cache."""

    def __init__(self, dist: str, seconds: dict[str, float]) -> None:
        self.dist, self.seconds = dist, seconds
        self.cache = self

    def getoption(self, name: str) -> Any:
        return {"dist": self.dist}[name]

    def getvalue(self, name: str) -> Any:
        return {"tx": ["popen", "popen"]}[name]

    def get(self, key: str, default: Any) -> Any:
        return self.seconds if key == conftest._SECONDS_KEY else default


class _Worker:
    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)


def test_files_sharing_helper_processes_are_one_scope():
    sched = conftest.pytest_xdist_make_scheduler(config=_Config("loadfile", {}), log=None)
    seed, roundtrip = (
        sched._split_scope(f"tests/deepspeed/{f}::t") for f in ("test_seed000.py", "test_roundtrip.py")
    )
    assert seed == roundtrip != "tests/deepspeed/test_seed000.py"
    assert sched._split_scope("tests/test_cli.py::test_env[x::y]") == "tests/test_cli.py"
    assert conftest.pytest_xdist_make_scheduler(config=_Config("load", {}), log=None) is None  # asked for


def test_a_worker_gets_the_longest_remaining_file_first():
    seconds = {"tests/test_b.py": 10.0, "tests/test_c.py": 50.0}  # the previous run's
    sched = conftest.pytest_xdist_make_scheduler(config=_Config("loadfile", seconds), log=None)
    nodeids = [f"tests/test_{x}.py::t" for x in "abc"]
    sched.workqueue = OrderedDict((n.split("::")[0], {n: False}) for n in nodeids)
    worker = _Worker()
    sched.registered_collections[worker] = nodeids
    for _ in nodeids:
        sched._assign_work_unit(worker)
    assert worker.sent == [[2], [1], [0]]  # c (50 s), b (10 s), then a (no figure: last)
