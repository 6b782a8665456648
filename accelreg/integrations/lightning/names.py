"""The backend names in Lightning's accelerator registries: ``enable()`` registers every backend
that is here with a :class:`~.accelerator.RegistryAccelerator` class (``accelerator="npu"``),
``disable()`` removes exactly those entries, and a Lightning accelerator package registering a
name accelreg registered replaces accelreg's entry.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

from ... import registry
from .accelerator import accelerator_class
from .flavors import FLAVORS, Flavor


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
