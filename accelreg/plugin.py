"""Everything a backend plugin needs, in one import.

A plugin module (registered in the ``accelreg`` entry-point group) writes::

    from accelreg import plugin

    @plugin.hookimpl
    def accelreg_backends():
        yield plugin.BackendSpec(name="acme", priority=75, is_available=..., device_count=...)

* :data:`hookimpl` — the marker for hook implementations (the hooks: :mod:`accelreg.hookspecs`,
  docs/hooks.md). ``@hookimpl(optionalhook=True)`` marks an implementation of a hook that a newer
  accelreg has and this one may not: it is ignored where the hook is unknown. Hook wrappers
  (``hookwrapper=True``/``wrapper=True``) are refused: accelreg calls each plugin's
  implementation alone, contained, so one plugin's failure stays its own.
* The records a plugin yields: :class:`BackendSpec` (with :class:`Availability`,
  :class:`MemoryInfo`, :data:`ProbeResult` for its probes, :class:`HardwareSignature` for
  hardware seen without its runtime, :data:`DtypeAnswer` for what its devices compute in) and
  :class:`PlacementRule`.
* For ``BackendSpec.dtypes``: :data:`COMPUTE_DTYPES`, the dtypes accelreg asks about, and
  :func:`try_dtypes`, a probe for a runtime that has no flag to ask (it runs a small computation
  in each on a device).
* :exc:`PlacementError` — what a rule's ``before_load`` raises for state it cannot load.
* Parsers for a visible-devices variable, for ``BackendSpec.parse_visible_devices``:
  :func:`parse_visible_devices` (strict: comma-separated ids, optionally sub-devices, ranges,
  UUIDs) and :func:`parse_visible_devices_truncating` (the CUDA runtime's reading).

accelreg's own built-in backends (:mod:`accelreg.builtin`) are written with this module alone,
exactly as a vendor's plugin is.
"""

from __future__ import annotations

from .dtypes import COMPUTE_DTYPES, try_dtypes
from .errors import PlacementError
from .hookspecs import hookimpl
from .registry.visible import parse_visible_devices, parse_visible_devices_truncating
from .types import (
    Availability,
    BackendSpec,
    DtypeAnswer,
    HardwareSignature,
    MemoryInfo,
    PlacementRule,
    ProbeResult,
)

__all__ = [
    "COMPUTE_DTYPES",
    "Availability",
    "BackendSpec",
    "DtypeAnswer",
    "HardwareSignature",
    "MemoryInfo",
    "PlacementError",
    "PlacementRule",
    "ProbeResult",
    "hookimpl",
    "parse_visible_devices",
    "parse_visible_devices_truncating",
    "try_dtypes",
]
