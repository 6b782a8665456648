"""Stand-in for ``habana_frameworks.torch.hpu``: the emulated ``torch.hpu`` module's API."""

from __future__ import annotations

import torch

from habana_frameworks.torch import _active  # noqa: F401  (activates the emulator)

_module = torch.hpu
globals().update({k: getattr(_module, k) for k in dir(_module) if not k.startswith("__")})


def wrap_in_hpu_graph(module: torch.nn.Module, *args: object, **kwargs: object) -> torch.nn.Module:
    """HPU graphs are not emulated: the module runs eagerly."""
    return module
