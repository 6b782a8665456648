"""Launching one process per device: visible-device masks for ranks.

A launcher (torchrun, the DeepSpeed launcher) starts N processes and tells each its
``LOCAL_RANK``; ``accelreg.resolve()`` in each picks logical device ``LOCAL_RANK``. To run on a
chosen subset of physical devices, mask them for the whole job: with
``ASCEND_RT_VISIBLE_DEVICES=0,2`` rank 0 gets physical 0 and rank 1 physical 2 (logical 1).
:func:`visible_devices_env` computes that mask for any backend without knowing its variable,
and ``accelreg run --devices 0,2 -- torchrun ...`` applies it (:func:`accelreg.launch.job.run`)
and starts the launcher.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import registry
from ..errors import ConfigError, DeviceError
from ..registry.visible import mask_value
from ..resolution import current_in_use

__all__ = ["check_devices_exist", "ids_problem", "visible_devices_env"]


def visible_devices_env(backend: str | None, ids: Sequence[int | str]) -> dict[str, str]:
    """The environment that makes physical devices ``ids`` logical devices 0..n-1 of ``backend``.

    ``backend=None`` means the current backend. The value is checked with the backend's own
    parser, so it is one the runtime accepts. Raises :class:`DeviceError` for a backend that
    has no visible-devices variable and :class:`ConfigError` for bad ids
    (:func:`ids_problem` says what is wrong with them without raising).
    """
    mask = _mask(backend, ids)
    if isinstance(mask, str):
        raise ConfigError(mask)
    return dict([mask])


def ids_problem(backend: str | None, ids: Sequence[int | str]) -> str | None:
    """What is wrong with ``ids`` as devices of ``backend`` (default: the current backend), as
    its parser reads them, or ``None`` when :func:`visible_devices_env` accepts them. Raises what
    it raises for anything but the ids (an unknown backend, one without a visible-devices
    variable, a broken configuration)."""
    mask = _mask(backend, ids)
    return mask if isinstance(mask, str) else None


def _mask(backend: str | None, ids: Sequence[int | str]) -> tuple[str, str] | str:
    """``(variable, value)`` masking ``ids`` in, or what is wrong with the ids."""
    snap = registry.get()
    if backend is None:
        b = current_in_use(snap)
    elif not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name (str), got {type(backend).__name__}")
    else:
        b = snap.backend(backend)
    var = b.spec.visible_devices_var
    if not var:
        raise DeviceError(f"{b.name} has no visible-devices variable; it cannot be masked per job")
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a sequence of device ids, got {type(ids).__name__}")
    if not ids:
        return "ids is empty: a job needs at least one device"
    try:
        value = mask_value(ids)
    except ConfigError as exc:
        return str(exc)
    parsed, problem = registry.parse_visible(b.spec, value)
    if problem is not None or parsed is None or len(parsed) != len(ids):
        why = (problem or "entries were dropped").removeprefix(f"{var}={value!r}: ")
        return f"{b.name} does not accept the device ids {value!r} (as its {var}): {why}"
    return var, value


def check_devices_exist(backend: str | None, ids: Sequence[int | str]) -> None:
    """Refuse ids that ``backend`` (default: the current one) does not have in this process.

    Without a mask the backend's physical devices are ``0..count-1``; under an inherited mask
    they are the ids it lists. ``"1.0"`` (device.subdevice) is checked by its device; ids that
    are not numbers (CUDA UUIDs) cannot be checked and pass. Raises :class:`DeviceError`
    naming the devices there are, so a job is never started on devices that do not exist
    (its ranks would find no device at all).
    """
    snap = registry.get()
    b = current_in_use(snap) if backend is None else snap.backend(backend)
    if not b.available:
        raise DeviceError(
            f"{b.name} is not available here ({b.probe().availability.reason}); "
            f"cannot start a job on its devices {', '.join(map(str, ids))}"
        )
    probed = b.probe()
    have = list(probed.visible) if probed.visible is not None else [str(i) for i in range(b.count)]
    bases = {h.split(".", 1)[0] for h in have}
    missing = [
        str(i) for i in ids if str(i).split(".", 1)[0].isdecimal() and str(i).split(".", 1)[0] not in bases
    ]
    if missing:
        var = b.spec.visible_devices_var
        where = f" (visible through {var}={snap.environ.get(var)!r})" if probed.visible is not None else ""
        raise DeviceError(
            f"{b.name} has no device {', '.join(missing)}: its devices here are {', '.join(have) or 'none'}{where}"
        )
