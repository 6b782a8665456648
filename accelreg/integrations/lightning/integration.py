"""The Lightning rows' integrations: one seam list (the connectors, the strategies, the accelerator
registries), built by :func:`integration_for` for each import name, and the ``lightning`` row's
``INTEGRATION``."""

from __future__ import annotations

import logging

from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam
from .connectors import (
    _check_and_init_precision,
    _check_strategy_and_fallback,
    _choose_auto_accelerator,
    _choose_strategy,
    _process_group_backend,
)
from .flavors import FLAVORS, Flavor
from .names import _register, _register_names, _unregister_names
from .strategies import (
    _deepspeed_setup_environment,
    _fsdp_forward_context,
    _setup_model,
    _setup_module,
)

__all__ = ["INTEGRATION", "RELEASES", "disable", "enable", "enabled", "integration_for"]

log = logging.getLogger("accelreg.integrations.lightning")

#: The releases every Lightning seam serves (both import names), and the ones the matrix runs.
RELEASES = table.row("lightning").releases


#: Shapes (:func:`~accelreg.integrations._machinery.seams.shape`) of each seam in the window 2.2.0-2.6.6;
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
    # _check_strategy_and_fallback (the FSDP strategies refused off CUDA): 2.2, 2.3-2.5.1 (type()
    # is FSDPStrategy), 2.5.2, 2.5.3+ (the Trainer's also accepts a CUDAAccelerator instance)
    "fabric:fallback": ("cbdd54da72664000", "4a69362e311f6ef4", "6ba93648c4fb792f"),
    "trainer:fallback": ("6f73af890927ded8", "d0589562dbe8ffa8", "d5395d3f56cc78d6", "05b555c8d05cf51d"),
    # FSDPPrecision.forward_context (autocast on "cuda"): one shape per half in the whole window
    "fabric:fsdp_autocast": ("495e33abb620cbdd",),
    "trainer:fsdp_autocast": ("5a5747ce59e88d40",),
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
        _fsdp_autocast_seam(pkg, "fabric"),
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
        _fsdp_autocast_seam(pkg, "trainer"),
    ]


def _fsdp_autocast_seam(pkg: str, half: str) -> Seam:
    """``FSDPPrecision.forward_context`` of Fabric's or the Trainer's package ``pkg``."""
    return Seam(
        f"{pkg}.plugins.precision.fsdp",
        "FSDPPrecision.forward_context",
        why="FSDP's 16-mixed/bf16-mixed autocast on a registry accelerator's device type, not cuda",
        adapters=(Adapter(RELEASES, _fsdp_forward_context, shapes=_SHAPES[f"{half}:fsdp_autocast"]),),
    )


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
    """The four decisions Fabric's ``_Connector`` and the Trainer's ``_AcceleratorConnector``
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
            f"{cls}._check_strategy_and_fallback",
            why="the FSDP strategies (fsdp, FSDPStrategy) run on a registry accelerator, not only on "
            "Lightning's CUDA one",
            adapters=(Adapter(RELEASES, _check_strategy_and_fallback, shapes=_SHAPES[f"{half}:fallback"]),),
        ),
        Seam(
            module,
            f"{cls}._check_and_init_precision",
            why="mixed precision autocasts on the registry backend's device type, not cuda",
            adapters=(Adapter(RELEASES, _check_and_init_precision, shapes=_SHAPES[f"{half}:precision"]),),
        ),
    ]


# -- the integrations -----------------------------------------------------------------------
def integration_for(flavor: Flavor) -> Integration:
    """The :class:`~accelreg.integrations._machinery.seams.Integration` of one Lightning import name."""
    seams: list[Seam] = []
    if flavor.fabric:
        seams += _fabric_seams(flavor.fabric)
    if flavor.trainer:
        seams += _trainer_seams(flavor.trainer)
    row = table.row(flavor.name)
    return Integration(
        **row.declared(flavor.installed_distribution()),
        seams=seams,
        scan_prefixes=(flavor.top,) + (("pytorch_lightning",) if flavor.top == "lightning_fabric" else ()),
        on_enable=lambda: _register_names(flavor),
        on_disable=lambda: _unregister_names(flavor),
    )


INTEGRATION = integration_for(FLAVORS["lightning"])


enable, disable, enabled = INTEGRATION.api()
