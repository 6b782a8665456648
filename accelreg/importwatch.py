"""Run a callback once a module has been imported (now, if it already is), and tell whether the
calling thread is inside an import.

``accelreg.install()`` must not import transformers, peft and DeepSpeed itself (seconds of
import time a user may not need). Instead each integration is enabled the moment its library
module finishes importing, through a finder on ``sys.meta_path`` that wraps that one module's
loader (:func:`when_imported`). The same finder can also run a callback the moment an import of
one of several modules *starts*, before any of its code runs (:func:`before_first_import`): a
process under ``accelreg run`` calls ``install()`` that way, only once a host library is
imported. Nothing a callback raises reaches the user's ``import`` statement: a failure becomes one
warning, never an exception inside somebody else's import (a callback that must stop the
process, as the start-up hook's does when accelreg cannot work there, does so itself).

Callbacks run in the wrapped loader's ``exec_module``, never in the finder's ``find_spec``:
Python runs finders under its global import lock (``importlib.util.find_spec`` too), and a
module that is not installed (``try: import deepspeed`` / ``except ImportError``) has no loader
to run them in — and needs no patching. A callback that runs in ``exec_module`` still runs
inside an import (this thread holds the module's import lock): code that could wait there for
another thread asks :func:`importing` first (the registry then runs plugin code in this thread;
see docs/design-notes.md, "The start-up hook never waits for an import").

This module sits at the bottom of the package (it imports nothing of accelreg): the
integrations, the registry and the start-up hook use it.
"""

from __future__ import annotations

import _thread
import sys

# Imported at interpreter start-up in every process of a job (accelreg.launch.startup): only
# what Python has loaded by then. logging and warnings are imported when a hook fails; the
# finder and loader are plain classes (the import system asks for their methods, not a base).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from typing import Any

__all__ = ["before_first_import", "cancel", "importing", "pending", "when_imported"]

_lock = _thread.RLock()
_waiting: dict[str, list[Callable[[Any], None]]] = {}
#: Module names whose first import runs a callback before the module executes.
_starting: dict[str, Callable[[], None]] = {}
#: Modules our loader is executing now: in ``sys.modules`` already, but not imported yet.
_executing: set[str] = set()

#: importlib's own frames that hold an import lock while code above them runs: a module's lock
#: (``_find_and_load``; ``_exec``/``_load`` for ``importlib.reload`` and legacy loaders) or the
#: global import lock (``_find_spec``, which runs every finder).
_LOCKING_FRAMES = frozenset({"_find_and_load", "_exec", "_load", "_find_spec"})
_BOOTSTRAP = ("<frozen importlib._bootstrap>", "importlib/_bootstrap.py", "importlib\\_bootstrap.py")


def importing() -> bool:
    """Whether the calling thread is inside an import: some module's code (or a finder) is
    running below it on this thread's stack, so this thread holds an import lock that another
    thread importing the same module would wait for.

    Such a thread must never wait for another thread that might import: the registry runs
    plugin code in it directly instead of on its probe thread (that thread's imports could wait
    for this one's locks until the probe timed out).
    """
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _LOCKING_FRAMES and code.co_filename.endswith(_BOOTSTRAP):
            return True
        frame = frame.f_back
    return False


class _Finder:
    """Finds nothing itself; for watched names it wraps the real loader's ``exec_module``.

    It never runs a callback: ``find_spec`` runs under Python's global import lock, for modules
    that may not be installed (then nothing is imported, and nothing needs patching) and for
    ``importlib.util.find_spec`` probes that import nothing.
    """

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in _waiting and fullname not in _starting:
            return None
        try:
            return self._wrapped(fullname, path, target)
        except Exception:  # noqa: BLE001 - the import system asks the other finders itself
            return None

    def _wrapped(self, fullname: str, path: Sequence[str] | None, target: Any) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
                return spec
            if spec is not None:
                return spec  # a legacy loader (load_module only): not watched
        return None


class _Loader:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_module(self, spec: ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        name = module.__name__
        with _lock:
            _executing.add(name)
        try:
            _start(name)  # before the module's code; callbacks it queues for ``name`` fire below
            self._inner.exec_module(module)
        finally:
            with _lock:
                _executing.discard(name)
        _fire(name, module)


_finder = _Finder()


def _idle() -> bool:
    return not _waiting and not _starting


def _start(name: str) -> None:
    """Run the callback waiting for the start of ``name``'s import (once, for every name it
    watches), outside the lock; a failure is a warning, never an error in the user's import."""
    with _lock:
        callback = _starting.get(name)
        if callback is None:
            return
        for key in [k for k, v in _starting.items() if v is callback]:
            del _starting[key]
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 - never raise into the user's import
        _report(name, exc)
    with _lock:
        if _idle() and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def _fire(name: str, module: Any) -> None:
    with _lock:
        callbacks = _waiting.pop(name, [])
        if _idle() and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's import
            _report(name, exc)


def _report(name: str, exc: BaseException) -> None:
    """A callback failed inside an import: say so without raising (even under ``-W error``)."""
    message = (
        f"accelreg: the hook run when {name} was imported failed and was skipped: {type(exc).__name__}: {exc}"
    )
    import warnings

    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - a warnings filter set to "error" must not break the import
        import logging

        logging.getLogger("accelreg.integrations").warning(message)


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` after ``name`` is imported; at once if it already is (a module
    whose import is under way, started by :func:`before_first_import`'s hook, is not yet)."""
    with _lock:
        module = None if name in _executing else sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


def before_first_import(names: Sequence[str], callback: Callable[[], None]) -> None:
    """Call ``callback()`` once, the moment the first import of any of ``names`` starts (before
    that module's code runs; callbacks it registers with :func:`when_imported` for that very
    module still fire). At once if one of them is already imported. A name that is not
    installed never fires: looking for it (``import``, ``importlib.util.find_spec``) runs
    nothing."""
    if any(name in sys.modules for name in names):
        callback()
        return
    with _lock:
        for name in names:
            _starting[name] = callback
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def cancel(name: str) -> None:
    """Forget the callbacks waiting for ``name``."""
    with _lock:
        _waiting.pop(name, None)
        if _idle() and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def pending(name: str) -> bool:
    """Whether callbacks are waiting for ``name`` to be imported."""
    with _lock:
        return bool(_waiting.get(name))
