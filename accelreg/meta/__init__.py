"""Models on the meta device, and the patch-free device map planned for them.

* :mod:`.build` — :func:`build_meta_model`: a transformers model from a model type, a config,
  a ``config.json`` or a checkpoint folder, built on the meta device (nothing downloaded, no
  weights read, no remote code run), with the head a task (:data:`TASKS`) or a class names.
* :mod:`.device_map` — :func:`device_map_for`: a fully qualified device map for such a model
  (or any model) with the registry's devices: the patch-free path that works on every
  transformers release, for frameworks that forbid monkeypatching::

    device_map = accelreg.device_map_for("path/to/checkpoint", {"npu:0": "20GiB", "cpu": "64GiB"})
    model = AutoModelForCausalLM.from_pretrained("path/to/checkpoint", device_map=device_map)

This is the only part of accelreg besides the transformers integration that builds transformers
models; it needs the ``hf`` extra.
"""

from __future__ import annotations

from ..errors import MetaModelError
from .build import DEFAULT_TASKS, TASKS, build_meta_model, tasks_for
from .device_map import device_map_for

__all__ = ["DEFAULT_TASKS", "TASKS", "MetaModelError", "build_meta_model", "device_map_for", "tasks_for"]
