"""accelerate: memory, cache, dispatch, default device and quantize-on-move ask the registry.

Seams (accelerate 1.10-1.16; the first five public, matched by their parameters; every module
that imported them by name is patched too):

* ``accelerate.utils.modeling.get_max_memory`` — two 7-way ``is_*_available()`` ladders.
  Without ``max_memory`` the replacement reads the free memory of the registry's current
  backend. A given ``max_memory`` keeps accelerate's contract exactly (int keys stay as they
  are, unchecked against this machine: the caller may plan for another one); the one addition
  is that a qualified key of the current backend (``"npu:1"``) becomes its index instead of
  upstream's "not recognized" error, and a qualified key of another backend is a
  :class:`~accelreg.DeviceError`.
* ``accelerate.utils.memory.clear_device_cache`` — its own backend order (xpu first); the
  replacement empties the current backend's cache.
* ``accelerate.big_modeling.dispatch_model`` — picks ``main_device`` as ``list(set(...))[0]``,
  which for string devices depends on the hash seed; the wrapper passes the first accelerator
  of the map in forward order.
* ``accelerate.utils.modeling.set_module_tensor_to_device`` — int devices go through a ladder,
  and bitsandbytes parameters are quantized on the way only for two hard-coded device types.
  The wrapper qualifies every device through the registry and quantizes bitsandbytes
  parameters on the way to any accelerator whose placement rules allow them there.
* ``accelerate.state.PartialState.default_device`` — a ninth backend order; the replacement
  answers the registry's current backend in upstream's form (``torch.device("npu")``, no
  index; ``cpu``): which backend comes from the registry, the index stays the runtime's, as
  upstream. Effective for states created after ``enable()``.
* ``accelerate.state.PartialState._prepare_backend`` and ``.set_device`` (private or rebuilt:
  pinned to the shapes of 1.10-1.16) — a rank a launcher started on a registry accelerator gets
  accelerate's multi-process type, a process group over ``accelreg.dist_backend()`` and the
  device ``<backend>:<LOCAL_RANK>``; never a backend the registry would not choose, and never
  the cpu in silence (a :class:`~accelreg.DeviceError` naming the call).

``load_state`` and ``load_checkpoint_and_dispatch`` onto a device type safetensors does not list
need no seam here: the safetensors row's seam answers every caller of safetensors at the callee
(:mod:`accelreg.integrations.safetensors`).

:data:`LAUNCHER` is the second integration, ``accelerate_launch`` (accelerate's command line:
``accelerate launch``, ``accelerate config default``, ``accelerate env``; :mod:`.launch`), enabled
when ``accelerate.commands.launch`` is imported.

The folder: :mod:`.modeling` and :mod:`.state` (the seams, by what they
decide), :mod:`.integration` (the accelerate row's ``INTEGRATION``) and :mod:`.launch` (the
launcher's seams and the accelerate_launch row).
"""

from __future__ import annotations

from .integration import INTEGRATION, RELEASES, TESTED, disable, enable, enabled
from .launch import LAUNCHER

__all__ = ["INTEGRATION", "LAUNCHER", "RELEASES", "TESTED", "disable", "enable", "enabled"]
