"""Stand-in for ``habana_frameworks.torch.utils.experimental``: the emulated device is a Gaudi2."""

from __future__ import annotations

import enum


class synDeviceType(enum.IntEnum):
    synDeviceGaudi = 1
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3


def _get_device_type() -> synDeviceType:
    return synDeviceType.synDeviceGaudi2
