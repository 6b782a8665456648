"""Lightning (Trainer and Fabric): every registered backend is an accelerator.

**Without install().** :class:`RegistryAccelerator` (``RegistryAccelerator()``, or
``RegistryAccelerator("mlu")``) is a Lightning accelerator for any backend of the registry; see
:mod:`accelreg.integrations.lightning_accelerator`.

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
:class:`~accelreg.integrations.seams.Integration` per top-level package, each built by
:func:`integration_for` from the same seam list and enabled when *its* package is imported:
``accelreg.integrations.lightning`` (this module, trigger ``lightning``),
``accelreg.integrations.pytorch_lightning`` and ``accelreg.integrations.lightning_fabric``.
Each patches only its own package (importing one never imports another).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from .. import registry
from ..queries import dist_backend
from ..resolution import current_in_use
from .lightning_accelerator import RegistryAccelerator, accelerator_class, fix_precision
from .seams import Adapter, Integration, Seam

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

log = logging.getLogger("accelreg.integrations.lightning")

#: The releases every Lightning seam serves (both import names), and the ones the matrix runs.
RELEASES = ">=2.2,<2.7"
TESTED = {"oldest": "2.2.5", "middle": "2.4.0", "newest": "2.6.6"}
_SCALER_WARNING = r".*GradScaler is enabled, but .* is not available.*"


@dataclass(frozen=True)
class Flavor:
    """One import name of Lightning: its top-level package and where its halves live.

    Attributes:
        name: The integration's name (``accelreg.integrations.<name>``).
        distribution: The distribution whose version is read.
        also_shipped_by: Other distributions that install the same package (``lightning_fabric``
            comes alone in ``lightning-fabric`` and bundled in ``pytorch-lightning``); the
            integration reads its version from the one installed.
        fabric: Fabric's package (``"lightning.fabric"``), or ``""``.
        trainer: The Trainer's package (``"lightning.pytorch"``), or ``""``.
    """

    name: str
    distribution: str
    fabric: str = ""
    trainer: str = ""
    also_shipped_by: tuple[str, ...] = ()

    def installed_distribution(self) -> str:
        """The distribution that installed the package here: :attr:`distribution`, else the
        first installed of :attr:`also_shipped_by` (``distribution`` when none is)."""
        for name in (self.distribution, *self.also_shipped_by):
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            return name
        return self.distribution

    @property
    def top(self) -> str:
        """The top-level package (the trigger and the scan prefix)."""
        return (self.fabric or self.trainer).split(".")[0]


#: The import names: the unified package, and the standalone Trainer and Fabric packages
#: (``pytorch-lightning`` bundles ``lightning_fabric``; ``lightning-fabric`` ships it alone).
FLAVORS: dict[str, Flavor] = {
    "lightning": Flavor("lightning", "lightning", fabric="lightning.fabric", trainer="lightning.pytorch"),
    "pytorch_lightning": Flavor("pytorch_lightning", "pytorch-lightning", trainer="pytorch_lightning"),
    "lightning_fabric": Flavor(
        "lightning_fabric",
        "lightning-fabric",
        fabric="lightning_fabric",
        also_shipped_by=("pytorch-lightning",),
    ),
}


def _registry_accelerator(connector: Any) -> RegistryAccelerator | None:
    accelerator = getattr(connector, "accelerator", None)
    return accelerator if isinstance(accelerator, RegistryAccelerator) else None


# -- the seams ------------------------------------------------------------------------------
def _choose_auto_accelerator(original: Any) -> Any:
    @functools.wraps(original)
    def _choose_auto_accelerator(*args: Any) -> str:
        lightnings = original(*args)
        snap = registry.get()
        current = current_in_use(snap)  # raises under a launcher past a present, failing backend
        if current.name != "cpu" or lightnings == "cpu":
            return current.name
        # The registry found no accelerator, Lightning's own ladder did: keep Lightning's pick
        # (hardware the registry has no backend for, like XLA, or sees as unavailable) unless
        # the user disabled that backend in accelreg's configuration.
        mine = snap.by_name.get(lightnings)
        return "cpu" if mine is not None and mine.blocked is not None else lightnings

    return _choose_auto_accelerator


def _choose_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def _choose_strategy(self: Any) -> Any:
        accelerator = _registry_accelerator(self)
        if accelerator is None:
            return original(self)
        names = original.__globals__
        if self._num_nodes_flag > 1:
            return "ddp"
        devices = list(self._parallel_devices or ())
        if len(devices) <= 1:
            device = devices[0] if devices else accelerator.device(0)
            return names["SingleDeviceStrategy"](device=device)
        return "ddp_fork" if names.get("_IS_INTERACTIVE") else "ddp"

    return _choose_strategy


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def _check_and_init_precision(self: Any) -> Any:
        accelerator = _registry_accelerator(self)
        if accelerator is None:
            return original(self)
        with warnings.catch_warnings():
            # Lightning builds its 16-bit scaler for the device type it assumed; it is replaced
            warnings.filterwarnings("ignore", message=_SCALER_WARNING)
            plugin = original(self)
        return fix_precision(plugin, accelerator.device_type)

    return _check_and_init_precision


def _process_group_backend(original: Any) -> Any:
    @functools.wraps(original)
    def _get_default_process_group_backend_for_device(device: Any) -> str:
        if device.type == "cpu":
            return original(device)
        snap = registry.get()
        current = snap.current()
        owner = current if current.device_type == device.type else None
        owner = owner or next((b for b in snap.order if b.device_type == device.type and b.available), None)
        if owner is None:
            return original(device)
        return dist_backend(owner.name)

    return _get_default_process_group_backend_for_device


def _side_stream(device: Any) -> Any:
    """The device's own side stream for building DDP (what Lightning does on its GPU), or none
    when the runtime has no stream module."""
    import torch

    module = getattr(torch, device.type, None)
    stream, make = getattr(module, "stream", None), getattr(module, "Stream", None)
    if stream is None or make is None or device.index is None:
        return contextlib.nullcontext()
    return stream(make(device=device))


def _ddp_wrap(original: Any, ids: str) -> Any:
    """DDP built without ``torch.cuda.Stream`` on a registry accelerator (``ids``: the
    strategy's method that names the device ids)."""

    @functools.wraps(original)
    def wrap(self: Any, module: Any) -> Any:
        if not isinstance(getattr(self, "accelerator", None), RegistryAccelerator):
            return original(self, module)
        device_ids = getattr(self, ids)() if self.root_device.index is not None else None
        ddp = original.__globals__["DistributedDataParallel"]
        with _side_stream(self.root_device) if device_ids is not None else contextlib.nullcontext():
            return ddp(module=module, device_ids=device_ids, **self._ddp_kwargs)

    return wrap


def _setup_model(original: Any) -> Any:
    return _ddp_wrap(original, "determine_ddp_device_ids")


def _setup_module(original: Any) -> Any:
    return _ddp_wrap(original, "_determine_ddp_device_ids")


def _deepspeed_setup_environment(original: Any) -> Any:
    @functools.wraps(original)
    def setup_environment(self: Any) -> None:
        if not isinstance(getattr(self, "accelerator", None), RegistryAccelerator):
            return original(self)
        # Lightning's DeepSpeed strategy refuses every accelerator but its CUDA one; DeepSpeed
        # itself runs on the accelerator install() hands it (the registry's backend), and the
        # process group is the backend's collectives: the rest of the set-up is DDP's, as on CUDA
        strategy = original.__globals__["DeepSpeedStrategy"]
        return super(strategy, self).setup_environment()

    return setup_environment


def _register(original: Any) -> Any:
    @functools.wraps(original)
    def register(self: Any, name: str, accelerator: Any = None, *args: Any, **kwargs: Any) -> Any:
        data = dict.get(self, name)
        ours = _added.get(id(self), {})
        if data is not None and ours.get(name) is data:
            dict.__delitem__(self, name)  # accelreg's entry yields to the package registering it
            del ours[name]
        return original(self, name, accelerator, *args, **kwargs)

    return register


#: Shapes (:func:`~accelreg.integrations.seams.shape`) of each seam in the window 2.2.0-2.6.6;
#: both import names have the same shapes. Every replacement but the DDP one wraps the original
#: (calls it, or returns to it for accelerators that are not accelreg's), so a new shape of those
#: is looked at for its contract only; the DDP one rebuilds the wrapper and is pinned to the one
#: shape the whole window has.
_SHAPES: dict[str, tuple[str, ...]] = {
    # 2.2 (an instance method, with the graphcore/habana rungs), 2.3-2.5.5 (a static method), 2.5.6+
    # (the static method calls device_parser._select_auto_accelerator)
    "fabric:auto": ("7cc1314d31572d93", "766338dea7f80158"),
    "trainer:auto": ("eb62fb60f11547f0", "2ebe52bd2c4dc6cd", "dd9f35c20698a867", "9793f97f4e3f71f2"),
    "fabric:strategy": ("8d868b741e084893",),
    # 2.2.0-2.2.1, 2.2.2-2.2.5, 2.3-2.5.5, 2.5.6+ (the ipu/hpu rungs removed, then "hpu" refused)
    "trainer:strategy": ("87d757ab4e4eba34", "aa6afd75e1358059", "bcaa35db7b4eee76", "1bc6320be7b5e6f4"),
    "fabric:precision": ("ceedbc53313f87c9", "7f7aab85ba06c6e8", "b7911b04b6ae352f"),
    "trainer:precision": ("74b5214d6e7f1d0d", "003737161709cfd0", "f885f8d32e0d3cda", "2c4b1d3e998f09f2"),
    # 2.2-2.5.4: "nccl" for cuda, else "gloo"; 2.5.5+: torch's default_device_backend_map
    "fabric:pg": ("b90316f15e4507a4", "650e1adc1726dbba"),
    "fabric:ddp": ("a40d716b3d3f90c7",),
    "trainer:ddp": ("bf45fe23d6b1808c",),
    # DeepSpeedStrategy.setup_environment: one shape for both halves in the whole window
    "deepspeed:env": ("8612c1ed66165fcf",),
}


def _fabric_seams(pkg: str) -> list[Seam]:
    return [
        *_connector_seams(f"{pkg}.connector", "_Connector", "fabric"),
        Seam(
            f"{pkg}.utilities.distributed",
            "_get_default_process_group_backend_for_device",
            importers=(
                f"{pkg}.strategies.ddp",
                f"{pkg}.strategies.fsdp",
                f"{pkg}.strategies.model_parallel",
            ),
            why="a registry backend's device gets the backend's collective backend (accelreg.dist_backend)",
            adapters=(
                Adapter(RELEASES, _process_group_backend, shapes=_SHAPES["fabric:pg"], params=("device",)),
            ),
        ),
        Seam(
            f"{pkg}.strategies.ddp",
            "DDPStrategy.setup_module",
            why="DDP on a registry backend is built without torch.cuda.Stream",
            adapters=(Adapter(RELEASES, _setup_module, shapes=_SHAPES["fabric:ddp"]),),
        ),
        _deepspeed_seam(pkg),
        Seam(
            f"{pkg}.accelerators.registry",
            "_AcceleratorRegistry.register",
            why="an accelerator package registering a name accelreg registered replaces accelreg's entry",
            adapters=(Adapter(RELEASES, _register, params=("self", "name", "accelerator", "description")),),
        ),
    ]


def _trainer_seams(pkg: str) -> list[Seam]:
    return [
        *_connector_seams(
            f"{pkg}.trainer.connectors.accelerator_connector", "_AcceleratorConnector", "trainer"
        ),
        Seam(
            f"{pkg}.strategies.ddp",
            "DDPStrategy._setup_model",
            why="DDP on a registry backend is built without torch.cuda.Stream",
            adapters=(Adapter(RELEASES, _setup_model, shapes=_SHAPES["trainer:ddp"]),),
        ),
        _deepspeed_seam(pkg),
    ]


def _deepspeed_seam(pkg: str) -> Seam:
    """``DeepSpeedStrategy.setup_environment`` of Fabric's or the Trainer's package ``pkg``."""
    return Seam(
        f"{pkg}.strategies.deepspeed",
        "DeepSpeedStrategy.setup_environment",
        why="the DeepSpeed strategies (deepspeed, deepspeed_stage_2/_3, offload) run on a registry "
        "accelerator, not only Lightning's CUDA one",
        adapters=(Adapter(RELEASES, _deepspeed_setup_environment, shapes=_SHAPES["deepspeed:env"]),),
    )


def _connector_seams(module: str, cls: str, half: str) -> list[Seam]:
    """The three decisions Fabric's ``_Connector`` and the Trainer's ``_AcceleratorConnector``
    both make, each with its own source shapes (``half``: ``fabric`` or ``trainer``)."""
    return [
        Seam(
            module,
            f"{cls}._choose_auto_accelerator",
            why='accelerator="auto" follows the registry\'s priority (cpu only when the registry says cpu)',
            adapters=(Adapter(RELEASES, _choose_auto_accelerator, shapes=_SHAPES[f"{half}:auto"]),),
        ),
        Seam(
            module,
            f"{cls}._choose_strategy",
            why="one device of a registry backend gets a single-device strategy on that device, not the cpu",
            adapters=(Adapter(RELEASES, _choose_strategy, shapes=_SHAPES[f"{half}:strategy"]),),
        ),
        Seam(
            module,
            f"{cls}._check_and_init_precision",
            why="mixed precision autocasts on the registry backend's device type, not cuda",
            adapters=(Adapter(RELEASES, _check_and_init_precision, shapes=_SHAPES[f"{half}:precision"]),),
        ),
    ]


# -- registering the backend names ------------------------------------------------------------
#: id(a Lightning accelerator registry) -> {name: the entry accelreg put there}
_added: dict[int, dict[str, Any]] = {}


def _lightning_registries(flavor: Flavor, *, load: bool = True) -> list[tuple[Any, str]]:
    """``(registry, package)``: the Trainer's ``AcceleratorRegistry`` and Fabric's
    ``ACCELERATOR_REGISTRY`` of ``flavor``, with the package their accelerators subclass (with
    ``load=False``, only those already imported)."""
    out = []
    for package, attr in ((flavor.trainer, "AcceleratorRegistry"), (flavor.fabric, "ACCELERATOR_REGISTRY")):
        if not package:
            continue
        name = f"{package}.accelerators"
        if not load and name not in sys.modules:
            continue
        out.append((getattr(importlib.import_module(name), attr), package))
    return out


def _register_names(flavor: Flavor) -> None:
    if flavor.trainer:
        # Lightning 2.2-2.5 registers extension accelerators (lightning_habana's) lazily, in the
        # Trainer's connector: let them register first, so their names keep their accelerators
        connector = importlib.import_module(f"{flavor.trainer}.trainer.connectors.accelerator_connector")
        external = getattr(connector, "_register_external_accelerators_and_strategies", None)
        if external is not None:
            external()
    snap = registry.get()
    # the backends that are here: available, or present but failing (so that asking for one by
    # name says why it fails); on a machine with neither, Lightning's registries stay as they are
    here = [b for b in snap.order if b.name != "cpu" and (b.available or b.presence() is not None)]
    for lightning_registry, package in _lightning_registries(flavor):
        ours = _added.setdefault(id(lightning_registry), {})
        for backend in here:
            if backend.name in lightning_registry:
                continue
            cls = accelerator_class(backend.name, (package,))
            lightning_registry.register(
                backend.name, cls, description=f"accelreg registry accelerator ({backend.name})"
            )
            ours[backend.name] = dict.get(lightning_registry, backend.name)


def _unregister_names(flavor: Flavor) -> None:
    for lightning_registry, _package in _lightning_registries(flavor, load=False):
        for name, entry in _added.pop(id(lightning_registry), {}).items():
            if dict.get(lightning_registry, name) is entry:
                dict.__delitem__(lightning_registry, name)


def registered_names(flavor: str = "lightning") -> dict[str, list[str]]:
    """The accelerator names accelreg registered in each Lightning registry of ``flavor`` (by
    package: ``{"lightning.pytorch": ["hpu", "mlu", "npu", ...], "lightning.fabric": [...]}``);
    empty while its integration is disabled."""
    return {
        package: sorted(_added.get(id(lightning_registry), {}))
        for lightning_registry, package in _lightning_registries(FLAVORS[flavor], load=False)
        if _added.get(id(lightning_registry))
    }


# -- the integrations -----------------------------------------------------------------------
def integration_for(flavor: Flavor) -> Integration:
    """The :class:`~accelreg.integrations.seams.Integration` of one Lightning import name."""
    seams: list[Seam] = []
    if flavor.fabric:
        seams += _fabric_seams(flavor.fabric)
    if flavor.trainer:
        seams += _trainer_seams(flavor.trainer)
    return Integration(
        name=flavor.name,
        distribution=flavor.installed_distribution(),
        trigger=flavor.top,
        releases=RELEASES,
        tested=TESTED,
        seams=seams,
        scan_prefixes=(flavor.top,) + (("pytorch_lightning",) if flavor.top == "lightning_fabric" else ()),
        on_enable=lambda: _register_names(flavor),
        on_disable=lambda: _unregister_names(flavor),
    )


INTEGRATION = integration_for(FLAVORS["lightning"])


enable, disable, enabled = INTEGRATION.api()
