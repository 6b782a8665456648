"""Stand-in for ``habana_frameworks.torch``: importing it brings up the emulated ``torch.hpu``.

The emulated devices use torch's in-tree HPU device type (``torch.device("hpu")``), so
tensors print and dispatch as HPU tensors. Exports ``hpu``, ``core`` and ``utils`` as the
real package does (accelerate, transformers and DeepSpeed import them), and registers Gaudi's
``torch.compile`` backend, ``hpu_backend``, once ``torch._dynamo`` is imported.
"""

from __future__ import annotations

from accelreg.importwatch import when_imported

from accelreg_emu._shim import shim_version

from . import _active, core, hpu, utils  # noqa: F401

__version__ = shim_version()
__all__ = ["core", "hpu", "utils"]


def _register_compile_backend(dynamo: object) -> None:
    """``hpu_backend``, the backend transformers makes ``torch.compile`` use on Gaudi (and
    DeepSpeed compiles its muon optimizer with at import), as Gaudi's runtime registers it: here
    it runs the captured graph eagerly. Registered when ``torch._dynamo`` is (not at ``import
    torch``, which brings this package up: dynamo costs seconds)."""
    from torch._dynamo.backends.registry import register_backend

    try:  # not list_backends(): it imports every backend, inductor too, inside dynamo's import
        register_backend(name="hpu_backend")(lambda graph, example_inputs: graph.forward)
    except AssertionError:  # "duplicate name": registered already
        pass


when_imported("torch._dynamo", _register_compile_backend)
