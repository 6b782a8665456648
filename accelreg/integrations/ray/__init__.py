"""Ray Core: the registry's backends are Ray resources, and each task or actor sees its own.

Ray decides which accelerators a node has from a fixed list of *accelerator managers* in its
own code (``ray._private.accelerators``): one class per device family, answering the resource
name, the device count on the node, and the visible-devices variable to set for a task. A
backend Ray does not list is invisible to it. With this integration every backend of the
registry that has a visible-devices variable gets a manager built from the registry:

- **resource name**: :attr:`BackendSpec.ray_resource_name <accelreg.types.BackendSpec.ray_resource_name>`
  — Ray's own name where the built-in plugin declares one (``NPU``, ``HPU``, ``GPU``), else the
  backend name upper-cased (``MLU``, ``MUSA``, ``SDAA``, a vendor's ``GCU``);
- **count** (asked when a node starts): the registry's device count, which respects the
  backend's mask; a backend that is present but failing gives a warning naming the backend
  and the reason, and 0 units;
- **per task**: a task or actor given ``k`` units gets the backend's visible-devices variable
  set to its ``k`` ids, and ``ACCELREG_DEVICE_ID=<backend>=<first id>``, so inside it
  ``accelreg.device_count() == k`` and ``accelreg.resolve()`` is device 0 of them (also in a
  Ray Train worker, whose ``LOCAL_RANK`` counts workers, not its devices). A worker process is
  reused across tasks: the registry re-reads the environment whenever Ray sets or restores a
  mask (:func:`accelreg.registry.refresh`), for Ray's own managers too.

Ray's own managers are left alone where accelreg adds nothing: for a resource name Ray
already has (``GPU``, ``NPU``, ``HPU``), accelreg's manager is used only when Ray's own finds
no device on the node and the backend's runtime package is installed (an Ascend node Ray
detects through ``/dev/davinci*`` keeps Ray's NPU manager; CUDA GPUs are always Ray's).

Seams (all in ``ray._private``; Ray has no public extension point for accelerators — its issue
#40880 "Support external accelerator plugin" is open): ``accelerators.get_all_accelerator_managers``
and ``accelerators.get_accelerator_manager_for_resource`` (the list and the lookup),
``utils.set_visible_accelerator_ids`` and ``utils.reset_visible_accelerator_env_vars`` (a task's
mask, set and restored), ``services.start_raylet`` (the raylet's environment gets
``ACCELREG_AUTO_INSTALL=1``, so every worker it starts installs accelreg's integrations too —
the case of ``accelreg.install(); ray.init()`` without ``accelreg run`` — and the node's failing
backends are reported). Ray Train's seams are the ``ray_train`` integration
(:mod:`accelreg.integrations.ray.train`): they import torch, which a process that only runs
Ray tasks must not pay for.

The folder: :mod:`.managers`, :mod:`.masks` and :mod:`.raylet` (the seams, by what they
decide), :mod:`.integration` (the ray row's ``INTEGRATION``) and :mod:`.train` (the ray_train row).
"""

from __future__ import annotations

from .integration import INTEGRATION, disable, enable, enabled
from .managers import manager_for, resources

__all__ = ["INTEGRATION", "disable", "enable", "enabled", "manager_for", "resources"]
