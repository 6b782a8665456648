"""The ``transformers_pipelines`` row (trigger ``transformers.pipelines``): a pipeline given an
integer device runs on the registry's device of that index.

Every pipeline's constructor is ``Pipeline.__init__`` (``pipelines/base.py``; ``pipeline()``
and each task's class go through it). Given an int (and, with neither ``device`` nor a device
map, the ``0`` it falls back to), it walks its own list of device types (mlu, musa, cuda, npu,
hpu, xpu, mps) and falls through to ``torch.device("cpu")``: a backend outside the list runs the
pipeline on the cpu, silently. The replacement turns an index into the registry's device
(:func:`accelreg.resolve`: ``<current backend>:<index>``, a :class:`~accelreg.DeviceError` past
the backend's devices or with no accelerator, never the cpu in silence) before transformers
sees it; ``device=None`` without a device map is the registry's device 0 when there is an
accelerator (transformers' own default, on the registry's backend). Strings, ``torch.device``,
``-1`` and a model loaded with a device map are left to transformers.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ... import registry
from ...resolution import current_in_use, resolve
from .._machinery import table
from .._machinery.seams import LIBRARIES, Integration, Seam

__all__ = ["INTEGRATION", "disable", "enable", "enabled", "pipeline_init"]


def _registry_device(device: Any, model: Any) -> Any:
    """The device to give transformers for ``device`` (``None``: leave it as it is)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return None  # another framework's model (transformers 4.57): its own device handling
    if device is None:
        if getattr(model, "hf_device_map", None) is not None:
            return None
        if current_in_use(registry.get()).name == "cpu":
            return None  # no accelerator: transformers' default is the cpu, as asked for
        return resolve(0)
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        return None
    return resolve(device)


def pipeline_init(original: Any) -> Any:
    """The replacement of ``Pipeline.__init__`` (``original``)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        device = _registry_device(bound.arguments.get("device"), bound.arguments.get("model"))
        if device is not None:
            bound.arguments["device"] = device
        original(*bound.args, **bound.kwargs)

    return __init__


ROW = table.row("transformers_pipelines")

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "transformers.pipelines.base",
            "Pipeline.__init__",
            pipeline_init,
            params=("self", "model", "device"),
            why="an integer device (and the default 0) is the registry's device of that index, not the cpu",
            instead='pass the device as a string: pipeline(..., device=str(accelreg.resolve(0))) ("emu:0")',
        )
    ],
    scan_prefixes=LIBRARIES,
)

enable, disable, enabled = INTEGRATION.api()
