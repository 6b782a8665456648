"""A launcher's device slots under a mask its node inherited.

DeepSpeed's launcher and accelerate's (``--gpu_ids``) name devices by *slot*: a position among
the devices the node's launch process sees. Under ``accelreg run --devices 1,3`` that process
inherited a mask, so slot 0 is physical device 1: :func:`slots_under_mask` maps slots to the
physical ids a mask for the ranks must name, so a job never leaves the devices it was given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ... import registry
from ...errors import DeviceError

if TYPE_CHECKING:
    from ...types import BackendSpec

__all__ = ["slots_under_mask"]


def slots_under_mask(spec: BackendSpec, environ: Mapping[str, str], slots: Sequence[int | str]) -> list[str]:
    """The physical ids a launcher's slots ``slots`` stand for on a node whose launch process has
    ``environ``: the slots themselves, or — under a mask of ``spec``'s visible-devices variable
    that process inherited (``accelreg run --devices 1,3``) — the mask's devices at those
    positions, so a job never leaves the devices it was given. Raises :class:`DeviceError` for a
    mask that cannot be read and for a slot it does not have."""
    ids = [str(i) for i in slots]
    var = spec.visible_devices_var
    inherited = environ.get(var) if var else None
    if inherited is None:
        return ids
    parsed, problem = registry.parse_visible(spec, inherited)
    if parsed is None:
        raise DeviceError(f"{var}={inherited!r} cannot be read: {problem}")
    outside = [i for i in ids if not i.isdecimal() or int(i) >= len(parsed)]
    if outside:
        raise DeviceError(
            f"the launcher asks for slot(s) {', '.join(outside)} of {spec.name}, but {var}={inherited!r} "
            f"gives this node {len(parsed)} device(s) ({', '.join(parsed) or 'none'}); slots are "
            "positions in that mask"
        )
    return [parsed[int(i)] for i in ids]
