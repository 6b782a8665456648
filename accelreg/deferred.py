"""Failures that happened where they could not be raised, raised by the next accelreg call.

An integration enabled from an import hook must never raise into the user's ``import``
statement. In strict mode (``ACCELREG_STRICT=1``) such a failure is recorded here and raised by
the next call that promises a registry-aware answer: ``accelreg.install()``, an integration's
``enable()``, ``accelreg.device_map_for()``. It sits at the bottom of the package so that both the
integrations (which record) and the patch-free path (which raises) use it without depending on
each other.
"""

from __future__ import annotations

import _thread

from .errors import IntegrationError

__all__ = ["raise_recorded", "record"]

_lock = _thread.allocate_lock()  # not threading: imported at a job process's start-up
_recorded: list[tuple[str, BaseException]] = []


def record(name: str, exc: BaseException) -> None:
    """Keep ``exc``, the failure of integration ``name`` inside an import hook, for :func:`raise_recorded`."""
    with _lock:
        _recorded.append((name, exc))


def raise_recorded() -> None:
    """Raise the first failure recorded inside an import hook in strict mode (with it as the
    cause) as an :class:`~accelreg.errors.IntegrationError`, and forget them all; nothing when
    there is none."""
    with _lock:
        failures = list(_recorded)
        _recorded.clear()
    if failures:
        name, exc = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise IntegrationError(
            f"strict mode: the {name} integration failed when its library was imported: "
            f"{type(exc).__name__}: {exc}{others}"
        ) from exc
