"""Lightning (Trainer and Fabric): every registered backend is an accelerator.

**Without install().** :class:`RegistryAccelerator` (``RegistryAccelerator()``, or
``RegistryAccelerator("mlu")``) is a Lightning accelerator for any backend of the registry; see
:mod:`accelreg.integrations.lightning.accelerator`.

**With install().** Lightning's accelerator choice is a closed ladder (tpu > mps > cuda > cpu),
its connectors give an accelerator they do not know a single-device strategy on the *cpu* and
autocast on ``"cuda"``, and its DDP wrapper is built inside a ``torch.cuda.Stream``. The seams,
for the Trainer (``<root>.trainer.connectors.accelerator_connector._AcceleratorConnector``,
``<root>.strategies.ddp.DDPStrategy``) and for Fabric (``<root>.connector._Connector``,
``<root>.strategies.ddp.DDPStrategy``, ``<root>.utilities.distributed``,
``<root>.accelerators.registry._AcceleratorRegistry``):

* ``_choose_auto_accelerator``: ``accelerator="auto"`` follows the registry's priority (the
  cpu only when the registry says cpu; a launcher-started process whose present backend fails
  raises :class:`~accelreg.errors.DeviceError`). When the registry finds no accelerator but
  Lightning's own ladder does (its XLA accelerator, which the registry has no backend for), the
  ladder's pick stands, unless the user disabled that backend in accelreg's configuration.
* ``_choose_strategy``: a :class:`RegistryAccelerator` with one device gets a single-device
  strategy *on that device*; several get ``"ddp"`` (``"ddp_fork"`` in a notebook), as Lightning
  does for its own accelerators.
* ``_check_and_init_precision``: ``16-mixed`` / ``bf16-mixed`` autocast on the backend's device
  type (and a 16-bit gradient scaler for it).
* ``_get_default_process_group_backend_for_device``: a device of a registry backend gets that
  backend's collective backend (``accelreg.dist_backend``); others keep Lightning's answer.
* ``DDPStrategy._setup_model`` (Trainer) / ``DDPStrategy.setup_module`` (Fabric): on a
  registry accelerator, DDP is built with the device's own stream module (no ``torch.cuda``).
* ``_AcceleratorRegistry.register``: a Lightning accelerator package registering a name accelreg
  registered replaces accelreg's entry instead of failing with "already present".
* ``DeepSpeedStrategy.setup_environment`` (Trainer and Fabric): the DeepSpeed strategies accept a
  registry accelerator (stock: CUDA only); DeepSpeed runs on the accelerator ``install()`` hands it.
* ``_check_strategy_and_fallback`` (Trainer and Fabric): the FSDP strategies (``"fsdp"``,
  ``FSDPStrategy(...)``) accept a registry accelerator (stock: "requires a GPU accelerator");
  ``ModelParallelStrategy`` (FSDP2) has no such check. ``FSDPPrecision.forward_context``: FSDP's
  mixed precision autocasts on the backend's device type (stock: ``"cuda"``). A sharded FSDP
  checkpoint loads back through the ``torch_sharded_tensor`` row
  (:mod:`accelreg.integrations.torch.sharded`).

``enable()`` also registers the name of every backend that is *here* — available, or present
but failing — and that Lightning's registries do not have yet (Fabric's ``ACCELERATOR_REGISTRY``
and the Trainer's ``AcceleratorRegistry``) with a :class:`RegistryAccelerator` class, so
``accelerator="npu"`` is valid on an npu node (and says why, when npu is there but fails);
Lightning's own names (cpu, cuda, mps, tpu) and names an extension registered first keep their
accelerators, and a machine with no such backend keeps Lightning's registries as they are.
``disable()`` removes exactly those entries and restores every patched function.

**Three integrations from one seam list.** Lightning ships the same code under two import
names: ``lightning`` (``lightning.pytorch`` + ``lightning.fabric``) and the standalone
``pytorch_lightning`` + ``lightning_fabric`` (``lightning_fabric`` alone for Fabric-only
installs). They are different modules with different classes, imported independently, and a
module must not be patched while its package is still importing. So there is one
:class:`~accelreg.integrations.Integration` per top-level package, each built by
:func:`integration_for` from the same seam list and enabled when *its* package is imported:
``accelreg.integrations.lightning`` (trigger ``lightning``),
``accelreg.integrations.lightning.pytorch_lightning`` and ``accelreg.integrations.lightning.fabric``.
Each patches only its own package (importing one never imports another).

The folder: :mod:`.accelerator` (:class:`RegistryAccelerator`), :mod:`.connectors`,
:mod:`.strategies` and :mod:`.names` (the seams, by what they decide), :mod:`.flavors` (the
import names), :mod:`.integration` (the seam list), :mod:`.fabric` and
:mod:`.pytorch_lightning` (the other two rows).
"""

from __future__ import annotations

from .accelerator import RegistryAccelerator
from .flavors import FLAVORS, Flavor
from .integration import INTEGRATION, disable, enable, enabled, integration_for
from .names import registered_names

__all__ = [
    "FLAVORS",
    "INTEGRATION",
    "Flavor",
    "RegistryAccelerator",
    "disable",
    "enable",
    "enabled",
    "integration_for",
    "registered_names",
]
