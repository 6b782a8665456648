"""``torch.accelerator`` follows the registry: one answer per process to "which accelerator".

``torch.accelerator`` is a second registry: the vendor runtime answers it (whichever runtime
registered itself with torch in this process), and it knows nothing of accelreg's
configuration. transformers, accelerate (1.16: ``get_torch_accelerator_backend``, its launcher,
its state, checkpointing, random seeding) and others ask it more every release, so a backend
the user disabled in accelreg (``ACCELREG_DISABLE=npu``), masked away, or ranked below another
one would still get their work.

Under ``install()`` this integration makes ``torch.accelerator``'s answers follow the registry
where the two disagree (docs/design-notes.md, "torch.accelerator follows the registry", says
why this rather than seaming each call site). Seam:
``torch.accelerator.current_accelerator`` — ``device_count()`` and ``is_available()`` call it
through the module's globals, so they follow too:

* the registry's current backend is an accelerator of another device type than torch's (or
  torch sees none yet): the registry's device type (``torch.device("emu")``), where torch has
  a device module for it;
* the registry says cpu and one of its backends has torch's device type (disabled, masked away,
  unavailable, or not chosen): ``None``, as torch answers on a machine without an accelerator;
* otherwise torch's own answer (the two agree; or a runtime no accelreg plugin describes, whose
  device type the registry has no opinion on: ``accelreg env`` says so).

Functions that address the current device of torch's accelerator runtime
(``current_device_index``, ``set_device_index``, ``synchronize``, streams, memory) stay
torch's: they agree whenever the registry's backend is torch's accelerator, which is the case
in every process with one accelerator runtime. Plugin code (a probe bringing a runtime up) sees
torch's own answers. :func:`report` compares the two for ``accelreg env``.

A second row, ``torch_sharded_tensor`` (:mod:`.sharded`, imported only when its trigger
``torch.distributed._shard.sharded_tensor`` is), answers torch's ``ShardedTensor`` the device of
a piece a rank does not hold (torch: ``torch.cuda``), so FSDP's sharded checkpoints load on a
registry backend.
"""

from __future__ import annotations

from .accelerator import registry_answer
from .integration import INTEGRATION, RELEASES, disable, enable, enabled, report

__all__ = ["INTEGRATION", "RELEASES", "disable", "enable", "enabled", "registry_answer", "report"]
