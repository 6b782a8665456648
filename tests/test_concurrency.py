"""Many threads resolving while the registry is reset and reconfigured."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

import accelreg

from ._fakes import make_dist, plugin, spec

PLUG = plugin(spec("cuda", 2, priority=100), spec("xpu", 3, priority=90))


def test_threads_never_see_a_half_built_registry():
    accelreg.register(PLUG, "fakeplugin_conc")
    stop = threading.Event()
    seen: list[object] = []
    errors: list[BaseException] = []
    allowed = {torch.device("cuda", 1), torch.device("xpu", 1)}

    def reader():
        try:
            while not stop.is_set():
                d = accelreg.resolve(1)
                order = [b.name for b in accelreg.backends()]
                # one answer and one order, each from one configuration
                assert d in allowed
                assert order[-1] == "cpu" and order[0] in ("cuda", "xpu")
                seen.append(d)
                time.sleep(0.0005)  # let the writer run: 64 spinning readers starve it of the GIL
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def writer():
        # Each configuration stays until some reader has answered from it, so the
        # readers really do race the change (a fast writer once finished all 20
        # switches before any reader ran, and the test saw only one answer).
        try:
            for i in range(20):
                want = "xpu" if i % 2 else "cuda"
                mark = len(seen)
                accelreg.configure(priority=[want])
                deadline = time.monotonic() + 30
                while not any(d.type == want for d in seen[mark:]):
                    if time.monotonic() > deadline:
                        raise AssertionError(f"no reader answered under priority={want!r} in 30 s")
                    time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(64)]
    for t in threads:
        t.start()
    w = threading.Thread(target=writer)
    w.start()
    w.join()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert set(seen) == allowed


_DIST_SOURCE = """
import accelreg
from accelreg.types import Availability, BackendSpec

@accelreg.hookimpl
def accelreg_backends():
    for name, priority, count in (("cuda", 100, 2), ("xpu", 90, 3)):
        yield BackendSpec(name=name, priority=priority, is_available=lambda: Availability(True, "fake"),
                          device_count=lambda c=count: c, current_index=lambda: 0)
"""


def test_64_threads_resolving_while_another_resets_and_changes_priority(tmp_path, monkeypatch):
    """The issue's scenario: the fake backends come from an installed distribution (entry
    points), so ``reset()`` forgets the explicit priority but not the backends; each reader's
    answer must come from one of the configurations that existed (cuda first or xpu first)."""
    root = make_dist(tmp_path, "conc-accel", "1.0", "fakeplugin_conc_ep", _DIST_SOURCE, "conc")
    monkeypatch.syspath_prepend(str(root))
    accelreg.reset()
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    stop = threading.Event()
    seen: list[torch.device] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                backend = accelreg.current_backend().name
                d = accelreg.resolve(1)
                assert d in (torch.device("cuda", 1), torch.device("xpu", 1)), d
                assert backend in ("cuda", "xpu"), backend
                seen.append(d)
                time.sleep(0.0005)  # let the writer run: 64 spinning readers starve it of the GIL
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def writer():
        try:
            for i in range(8):
                mark = len(seen)
                accelreg.reset()  # back to the default order: cuda first
                if i % 2:
                    accelreg.configure(priority=["xpu"])
                want = "xpu" if i % 2 else "cuda"
                deadline = time.monotonic() + 30
                while not any(d.type == want for d in seen[mark:]):
                    if time.monotonic() > deadline:
                        raise AssertionError(f"no reader answered {want} in 30 s")
                    time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(64)]
    for t in threads:
        t.start()
    w = threading.Thread(target=writer)
    w.start()
    w.join()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert {d.type for d in seen} == {"cuda", "xpu"} and len(seen) > 64


def test_reset_during_resolution_keeps_answers_consistent():
    accelreg.register(PLUG, "fakeplugin_conc2")
    accelreg.configure(priority=["xpu"])
    assert accelreg.resolve(2) == torch.device("xpu", 2)
    accelreg.configure(priority=["cuda"])
    with pytest.raises(accelreg.DeviceError, match="out of range: cuda has 2"):
        accelreg.resolve(2)  # the cached xpu answer did not survive the change


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_resolve_in_parent_and_forked_child():
    accelreg.register(PLUG, "fakeplugin_fork")
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(w, str(accelreg.resolve(1)).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    assert os.read(r, 100).decode() == "cuda:1"
    os.close(r)
    assert sys.modules["accelreg"].resolve(1) == torch.device("cuda", 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_forked_child_does_not_reprobe_the_runtime():
    calls = []

    def probe():
        calls.append(os.getpid())
        return True

    accelreg.register(plugin(spec("cuda", 2, priority=100, available=probe)), "fakeplugin_forkprobe")
    assert accelreg.resolve(0) == torch.device("cuda", 0)
    assert calls == [os.getpid()]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: answers from the parent's probes, with its own (empty) cache
        try:
            answer = f"{accelreg.resolve(1)}|{accelreg.device_count()}|{len(calls)}"
            os.write(w, answer.encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    assert os.read(r, 100).decode() == "cuda:1|2|1"
    os.close(r)
