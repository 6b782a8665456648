"""Built-in backend: Intel GPU (``torch.xpu``, part of torch since 2.4)."""

from __future__ import annotations

from functools import partial

from ..plugin import hookimpl, parse_visible_devices
from ._torchmod import torch_module_backend

VAR = "ZE_AFFINITY_MASK"


def _not_compiled(module) -> str | None:
    import torch

    compiled = getattr(module, "_is_compiled", None)
    if compiled is not None and not compiled():
        return f"torch {torch.__version__} was built without XPU support"
    return None


@hookimpl
def accelreg_backends():
    yield torch_module_backend(
        "xpu",
        priority=90,
        package=None,
        visible_devices_var=VAR,
        # Level Zero accepts "device" and "device.subdevice" entries.
        parse_visible=partial(parse_visible_devices, var=VAR, subdevices=True),
        not_compiled=_not_compiled,
        dist_backend="xccl",
        ray_resource="GPU",  # Ray's own name (Ray's Intel GPU manager)
        description="Intel GPU (torch.xpu)",
    )
