"""transformers: ``from_pretrained(device_map=...)`` asks the registry.

Seams, each with one adapter per known shape (transformers 4.57 and 5.0-5.25; private
functions are matched by :func:`~accelreg.integrations._machinery.seams.shape`, see docs/compatibility.md):

* ``integrations.accelerate.check_and_set_device_map`` — normalises ``device_map``. Upstream
  turns only the exact string ``"cuda"`` into ``cuda:LOCAL_RANK``, keeps ints and dict values
  as given (torch then maps ints to whatever it calls "the accelerator") and accepts ``True``.
  The replacement resolves every int, backend name, device string and ``torch.device``
  through :func:`accelreg.resolve` — LOCAL_RANK-aware for every backend — and keeps ``"disk"``
  inside dicts. A backend that is not available here (``"cuda"`` on an Ascend node) is refused
  with a :class:`~accelreg.DeviceError` naming what is available; it is never remapped.
* ``integrations.accelerate._get_device_map`` — plans ``"auto"``/``"balanced"``/
  ``"balanced_low_0"``/``"sequential"`` with transformers' copy of accelerate's planner and
  ladders. The replacement plans with :func:`accelreg.plan_device_map` (tied weights declared
  by the model kept together, budgets from the registry, the quantizer's ``adjust_max_memory``
  and ``validate_environment`` applied as upstream does) and validates user-written maps with
  :func:`accelreg.check_device_map`. A bitsandbytes load that a planned or written map sends to
  a device type bitsandbytes does not support is refused, as for the default map below.
* ``integrations.accelerate.expand_device_map`` — matches keys as unescaped regexes without a
  name boundary (``"model.layers.1"`` captures ``model.layers.10``) and silently sends
  unmatched parameters to ``""`` or cpu. The replacement matches the longest dotted prefix and
  raises for an uncovered parameter.
* ``Bnb8BitHfQuantizer/Bnb4BitHfQuantizer.update_device_map`` — the default map of a
  quantized load (cuda > npu > hpu > xpu, else silently cpu). The replacement uses the
  registry's device, and refuses a backend bitsandbytes does not support.
* ``quantizers.base.HfQuantizer.postprocess_model`` — after loading, the placement rules are
  attached to the model, so any later ``load_state_dict`` (DeepSpeed, Trainer, accelerate,
  torch) places quantized state correctly.
* ``modeling_utils.PreTrainedModel.from_pretrained`` (public) — carries ``offload_folder`` to
  the planner (it counts as a disk budget, as upstream's planner offloads to disk when it is
  given) and gives ``model.hf_device_map`` back in transformers' own value forms (ints for
  accelerator indices of a planned map, the user's own values for a map the user wrote),
  while loading itself uses fully qualified devices.

* ``integrations.hub_kernels.kernelize`` — transformers 5.25 kernelizes every
  ``from_pretrained`` by default once the ``kernels`` package is installed, and then (a) reads
  an int device-map value as a device (``device_map={"": 1}``: ``'int' object has no attribute
  'type'``, on any accelerator) and (b) hands the device type to the kernels library, which
  refuses every type outside its own list (``Unsupported device type '<type>'``): a backend the
  registry knows, loading any model, fails. The replacement qualifies int values through the
  registry and, when kernels were not asked for (the default) and the kernels library does not
  run on the device type (asked by :func:`hub_kernels_support`, a behaviour probe of its public
  ``kernelize``), leaves the model's own torch layers in place, as upstream's fallback does
  for a layer without a kernel: ``model.use_kernels`` reads ``False``. An explicit request
  (``use_kernels=True`` or a ``kernel_config``) is passed through, so the kernels library's own
  error answers it.
  Releases before 5.13 have no ``kernelize`` there; 5.13-5.24 kernelize only on request.

transformers 4.57 has no ``check_and_set_device_map`` (``from_pretrained`` normalises inline,
then calls ``modeling_utils._get_device_map``, whose 4.57 adapter qualifies every dict value
through the registry) and its ``expand_device_map`` already matches exact dotted prefixes
(nothing to fix there).

The folder: :mod:`.device_map`, :mod:`.quantizers` and :mod:`.kernels` (the seams, by what they
decide) and :mod:`.integration` (the row's ``INTEGRATION``). Three more rows of the same library
live here, each enabled when the module holding its seams is imported: :mod:`.training`
(``TrainingArguments``' device and mixed precision, with :mod:`.precision`), :mod:`.trainer` (the
Trainer's random state in checkpoints) and :mod:`.pipelines` (a pipeline's integer device).
"""

from __future__ import annotations

from .device_map import normalize_device_map
from .integration import INTEGRATION, disable, enable, enabled
from .kernels import hub_kernels_support

__all__ = ["INTEGRATION", "disable", "enable", "enabled", "hub_kernels_support", "normalize_device_map"]
