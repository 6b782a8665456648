"""Running plugin code contained: the probe thread and its timeout, the re-entry guard, and
formatting whatever plugin code raised or returned without trusting it.

Everything a plugin raises is caught here, ``SystemExit`` included (a plugin calling
``sys.exit()`` must not end the caller's process); ``KeyboardInterrupt`` still propagates.
Messages are built from exact ``str`` copies, so an answer whose ``repr()`` raises or an
exception whose ``str()`` raises is described, not re-raised.

A thread inside an import (:func:`accelreg.importwatch.importing`) runs plugin code itself,
without the probe thread and its timeout, and never waits for a lock that a thread running
plugin code may hold (:func:`acquire`): it holds an import lock that the probe thread's own
imports could be waiting for, so waiting in turn would last until the probe timed out.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..importwatch import importing

__all__ = [
    "CONTAINED",
    "Nonsense",
    "ProbeTimeout",
    "Reentry",
    "acquire",
    "call_inline",
    "call_with_timeout",
    "check_not_inside_plugin",
    "describe",
    "inside_plugin",
    "safe_repr",
    "safe_str",
]

#: What plugin code may raise and still be contained. Everything else (``KeyboardInterrupt``,
#: ``GeneratorExit``) propagates: the user asked to stop.
CONTAINED: tuple[type[BaseException], ...] = (Exception, SystemExit)

_MAX_TEXT = 500


class ProbeTimeout(Exception):
    """A probe did not answer within ``probe_timeout`` seconds."""


class Nonsense(Exception):
    """Plugin code answered a value of the wrong type or range (the message says which)."""


class Reentry(Exception):
    """Plugin code called back into accelreg while accelreg was running it."""


#: ``inside``: this thread is running plugin code; ``reentered``: that code called accelreg.
_local = threading.local()

_REENTRY = (
    "called back into accelreg (resolve(), backends(), ...) while accelreg was running it; "
    "a plugin's hooks and probes must not query accelreg"
)


def check_not_inside_plugin() -> None:
    """Refuse a registry query made from plugin code that accelreg is running.

    Without this a probe asking ``accelreg.resolve()`` waits for the registry it is helping to
    build and is cut off only by the probe timeout. The plugin fails at once instead, with a
    record saying why, even if it swallows the exception.
    """
    if getattr(_local, "inside", False):
        _local.reentered = True
        raise Reentry(_REENTRY)


def inside_plugin() -> bool:
    """Whether this thread is running plugin code for accelreg right now (a probe, a hook).

    Code that answers for accelreg inside a library a plugin calls (torch.accelerator under
    ``install()``) gives the library's own answer there instead of querying the registry.
    """
    return bool(getattr(_local, "inside", False))


def _run_marked(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    outer = getattr(_local, "inside", False), getattr(_local, "reentered", False)
    _local.inside, _local.reentered = True, False
    try:
        try:
            value = fn(*args)
        except CONTAINED:
            if _local.reentered:  # whatever it raised, the cause is the re-entry
                raise Reentry(_REENTRY) from None
            raise
        if _local.reentered:  # it swallowed the refusal: still a failure
            raise Reentry(_REENTRY)
        return value
    finally:
        _local.inside, _local.reentered = outer


def call_inline(fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> Any:
    """Run plugin code in this thread, without a timeout (accelreg's own built-ins)."""
    return _run_marked(fn, args)


class _Runner:
    """One daemon thread that runs probes, replaced when a probe overstays its timeout.

    A stuck driver call cannot be killed, but it must not hang the caller: the worker is
    abandoned (it is a daemon, so it never keeps the process alive) and a fresh one serves
    the next probe. Reusing one thread keeps the first ``resolve()`` cheap.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Any] | None = None
        self._pid = 0
        self._ident: int | None = None

    def _start(self) -> queue.SimpleQueue[Any]:
        jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        worker = threading.Thread(target=self._serve, args=(jobs,), name="accelreg-probe", daemon=True)
        worker.start()
        self._jobs, self._pid, self._ident = jobs, os.getpid(), worker.ident
        return jobs

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while True:
            fn, args, box, done = jobs.get()
            try:
                box.append((True, _run_marked(fn, args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who decides
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
        if threading.get_ident() == self._ident and os.getpid() == self._pid:
            return _run_marked(fn, args)  # already on the probe thread: never wait on itself
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        with self._lock:
            jobs = self._jobs if self._jobs is not None and self._pid == os.getpid() else self._start()
            jobs.put((fn, args, box, done))
            if not done.wait(timeout):
                self._jobs = None  # abandon the stuck worker
                raise ProbeTimeout(f"no answer within {timeout:g} s (probe_timeout)")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def after_fork(self) -> None:
        """Fresh lock and no worker in a forked child (the probe thread did not survive)."""
        self._lock = threading.Lock()
        self._jobs = None


runner = _Runner()


def call_with_timeout(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    """Run ``fn(*args)`` on the probe thread; raise :class:`ProbeTimeout` past ``timeout``.

    In a thread that is inside an import, ``fn`` runs in that thread, without a timeout: the
    probe thread's imports could wait for this thread's import lock until they timed out.
    """
    if importing():
        return _run_marked(fn, args)
    return runner.call(fn, args, timeout)


def acquire(lock: Any) -> bool:
    """Take ``lock`` (a ``threading.Lock``) for work that runs plugin code; returns whether it
    was taken. A thread inside an import takes it only if it is free now, and otherwise does the
    work without it (and keeps the result to itself): whoever holds it may be waiting, through
    the probe thread, for this thread's import lock."""
    if importing():
        return bool(lock.acquire(blocking=False))
    lock.acquire()
    return True


# -- describing what plugin code raised or returned -----------------------------------------
def _exact(text: Any) -> str:
    """An exact ``str`` copy of ``text`` (a ``str`` subclass may override anything)."""
    out = str.__str__(text)
    return out if len(out) <= _MAX_TEXT else out[: _MAX_TEXT - 3] + "..."


def type_name(value: Any) -> str:
    """The name of ``value``'s class, whatever its metaclass does."""
    try:
        name = type(value).__name__
        return _exact(name) if isinstance(name, str) else "object"
    except CONTAINED:
        return "object"


def safe_str(value: Any) -> str:
    """``str(value)``, or a description when that raises."""
    try:
        text = str(value)
        return _exact(text) if isinstance(text, str) else f"<unprintable {type_name(value)}>"
    except CONTAINED:
        return f"<unprintable {type_name(value)}: its str() raised>"


def safe_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, or a description when that raises."""
    try:
        text = repr(value)
        text = _exact(text) if isinstance(text, str) else f"<{type_name(value)} object>"
    except CONTAINED:
        return f"<{type_name(value)} object whose repr() raised>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """One line for a failure record. accelreg's own exceptions are described by their message
    alone; a plugin's exception as ``Type: message``."""
    if isinstance(exc, ProbeTimeout):
        return f"timed out: {safe_str(exc)}"
    if isinstance(exc, (Nonsense, Reentry)):
        return safe_str(exc)
    text = safe_str(exc)
    return f"{type_name(exc)}: {text}" if text else type_name(exc)
