"""A Lightning accelerator answered by the registry: :class:`RegistryAccelerator`.

``RegistryAccelerator(backend=None)`` is a Lightning ``Accelerator`` for any registered backend
(the current one by default), usable without ``accelreg.install()``::

    trainer = Trainer(accelerator=RegistryAccelerator(), devices=1)
    fabric = Fabric(accelerator=RegistryAccelerator("mlu"), devices=2)  # with install(), see below

Device parsing, the parallel devices, the device count for ``devices="auto"``, availability
(with the registry's reason), device statistics (the backend's memory info) and the device
set-up all come from the registry: ``BackendSpec.device`` / ``device_count`` / ``memory_info``
through accelreg's snapshot, so a vendor plugin gets all of it without writing any Lightning
code.

Lightning has two import names with the same classes copied (``lightning.pytorch`` /
``lightning.fabric``, and the standalone ``pytorch_lightning`` / ``lightning_fabric``), and the
Trainer and Fabric each check ``isinstance(accelerator, <their Accelerator>)``. The object
``RegistryAccelerator(...)`` returns is an instance of a class made for its backend that
subclasses this mixin and the ``Accelerator`` of every Lightning package imported in the
process (the first installed one is imported when none is), so one object is accepted by
whichever Trainer or Fabric it is given to; ``isinstance(x, RegistryAccelerator)`` holds for
all of them. Lightning calls ``parse_devices``, ``is_available``, ... on the *class*: each
class knows its backend.

What an accelerator object cannot do alone (Lightning decides it in its connectors): put a
single device on the device instead of the cpu under Fabric, autocast on the device type under
Fabric, name the collective backend and keep DDP off ``torch.cuda.Stream`` for several
devices. ``accelreg.install()`` (or ``accelreg.integrations.lightning.enable()``) does those;
see :mod:`accelreg.integrations.lightning`. Without it, the Trainer's single-device run is
moved onto the device when the Trainer sets the accelerator up (:meth:`RegistryAccelerator.setup`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
from typing import Any

from ... import registry
from ...errors import DeviceError
from ...registry import Backend
from ...resolution import current_in_use
from ...types import Availability

__all__ = ["ROOTS", "RegistryAccelerator", "accelerator_class", "imported_roots"]

log = logging.getLogger("accelreg.integrations.lightning")

#: Lightning's packages that define an ``accelerators.Accelerator``: the unified package's two
#: halves and the standalone distributions. A Trainer root's Accelerator subclasses its Fabric's.
ROOTS = ("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric")
_TRAINER_OF = {"lightning.fabric": "lightning.pytorch", "lightning_fabric": "pytorch_lightning"}

_lock = threading.Lock()
_classes: dict[tuple[str, tuple[str, ...]], type] = {}


def imported_roots() -> tuple[str, ...]:
    """The Lightning roots a :class:`RegistryAccelerator` made now subclasses: the Trainer half of
    every Lightning import name in ``sys.modules`` (the Fabric half when the Trainer's package is
    absent); when none is imported, the first installed of ``lightning``, ``pytorch_lightning``,
    ``lightning_fabric`` is imported."""
    roots: list[str] = []
    if "lightning" in sys.modules:
        roots.append("lightning.pytorch")
    if "pytorch_lightning" in sys.modules:
        roots.append("pytorch_lightning")
    elif "lightning_fabric" in sys.modules:
        roots.append("lightning_fabric")
    if roots:
        return tuple(roots)
    for top, root in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
        if importlib.util.find_spec(top) is not None:
            return (root,)
    if importlib.util.find_spec("lightning_fabric") is not None:
        return ("lightning_fabric",)
    raise DeviceError(
        "RegistryAccelerator needs Lightning: none of lightning, pytorch_lightning or lightning_fabric "
        "is installed (pip install lightning)"
    )


def _bases(roots: tuple[str, ...]) -> tuple[type, ...]:
    bases = []
    for root in roots:
        base = importlib.import_module(f"{root}.accelerators").Accelerator
        if not any(issubclass(b, base) for b in bases):
            bases.append(base)
    return tuple(bases)


def accelerator_class(backend: str, roots: tuple[str, ...]) -> type:
    """The accelerator class for ``backend`` that subclasses the ``Accelerator`` of each Lightning
    root in ``roots`` (and :class:`RegistryAccelerator`); made once, then cached."""
    key = (backend, tuple(roots))
    with _lock:
        cls = _classes.get(key)
        if cls is None:
            name = f"RegistryAccelerator[{backend}]"
            cls = type(
                name,
                (RegistryAccelerator, *_bases(key[1])),
                {"_backend": backend, "_roots": key[1], "__module__": __name__, "__qualname__": name},
            )
            _classes[key] = cls
        return cls


def _rebuild(backend: str, roots: tuple[str, ...]) -> RegistryAccelerator:
    """Unpickle an accelerator (Lightning's ``ddp_spawn`` sends the Trainer to each process)."""
    return accelerator_class(backend, roots)()


class RegistryAccelerator:
    """A Lightning ``Accelerator`` for a backend of accelreg's registry.

    Args:
        backend: A backend name (``"npu"``, ``"mlu"``, ``"cpu"``, a vendor plugin's name);
            ``None``: the registry's current backend under the same rule as ``resolve()``
            (a present but failing accelerator passed over warns, and raises under a launcher).

    Raises:
        DeviceError: an unknown backend, or one that is not available here (the message says
            why, and what is available).

    Attributes:
        backend: The backend's name.
        device_type: The torch device type of its devices.
    """

    _backend: str | None = None
    _roots: tuple[str, ...] = ()

    def __new__(cls, backend: str | None = None) -> RegistryAccelerator:
        if cls._backend is not None:
            if backend is not None and backend != cls._backend:
                raise DeviceError(f"{cls.__qualname__} is the {cls._backend} accelerator, not {backend!r}")
            return object.__new__(cls)
        snap = registry.get()
        if backend is None:
            name = current_in_use(snap).name
        elif isinstance(backend, str):
            name = snap.backend(backend).name  # DeviceError naming the registered backends
        else:
            raise TypeError(f"backend must be a backend name (str) or None, got {type(backend).__name__}")
        return object.__new__(accelerator_class(name, imported_roots()))

    def __init__(self, backend: str | None = None) -> None:
        chosen = self._live()
        if not chosen.available:
            raise DeviceError(
                f"{chosen.name} is not available ({chosen.probe().availability.reason}); "
                f"available: {registry.get().available_summary()}"
            )
        self.backend = chosen.name
        self.device_type = chosen.device_type

    def __repr__(self) -> str:
        return f"RegistryAccelerator({self._backend!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._backend, type(self)._roots))

    # -- the backend, from the registry's current snapshot ---------------------------------
    @classmethod
    def _live(cls) -> Backend:
        if cls._backend is None:
            raise TypeError("RegistryAccelerator's class methods are called on an accelerator's class")
        return registry.get().backend(cls._backend)

    @classmethod
    def _per_process(cls) -> bool:
        """Devices are counted, not indexed: the cpu (processes on the host, as Lightning's own
        cpu accelerator) and backends that address devices without an index."""
        b = cls._live()
        return b.device_type == "cpu" or not b.spec.indexed

    @classmethod
    def availability(cls) -> Availability:
        """Whether the backend is available here, and the registry's reason."""
        try:
            return cls._live().probe().availability
        except DeviceError as exc:  # no longer registered (configure() changed the registry)
            return Availability.no(str(exc))

    # -- Lightning's Accelerator interface: class level -------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        """Whether the backend is available (:meth:`availability` says why not)."""
        return cls.availability().available

    @classmethod
    def name(cls) -> str:
        """The backend's name (the ``accelerator=`` string under ``install()``)."""
        return str(cls._backend)

    @classmethod
    def auto_device_count(cls) -> int:
        """The devices ``devices="auto"`` means: every device of the backend (1 for the cpu)."""
        b = cls._live()
        return 1 if b.device_type == "cpu" else b.count

    @classmethod
    def parse_devices(cls, devices: Any) -> list[int] | int:
        """Lightning's ``devices=`` argument as device indices (``2`` -> ``[0, 1]``, ``[1]``,
        ``"0,1"``, ``"1,"`` -> ``[1]``, ``-1`` -> all), or a count of processes for the cpu and
        for backends without device indices; a device that does not exist raises
        :class:`DeviceError` naming those that do."""
        b = cls._live()
        count = b.count
        if cls._per_process():
            n = _count(devices, b.name)
            if n == -1 and b.device_type != "cpu":
                n = count
            if n < 1 or (b.device_type != "cpu" and n > count):
                raise DeviceError(
                    f"devices={devices!r}: {b.name} {_has(b)}; ask for 1 to {max(count, 1)} device(s)"
                    if b.device_type != "cpu"
                    else f"devices={devices!r}: ask for a number of processes > 0 on the cpu"
                )
            return n
        indices = _indices(devices, count, b.name)
        bad = [i for i in indices if not 0 <= i < count]
        if bad or not indices or len(set(indices)) != len(indices):
            why = "repeats a device" if indices and not bad and len(set(indices)) != len(indices) else ""
            why = why or (
                f"asks for {[f'{b.device_type}:{i}' for i in bad]}" if bad else "asks for no device"
            )
            raise DeviceError(f"devices={devices!r} {why}: {b.name} {_has(b)}")
        return indices

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[Any]:
        """The ``torch.device`` of each parsed device (the registry's index -> device mapping)."""
        b = cls._live()
        if isinstance(devices, int) and not isinstance(devices, bool):
            return [b.device(0)] * devices
        return [b.device(int(i)) for i in devices]

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Lightning's hook: register this backend's class under its name."""
        accelerator_registry.register(
            cls.name(), cls, description=f"accelreg registry accelerator ({cls.name()})"
        )

    # -- instance level ------------------------------------------------------------------------
    def device(self, index: int = 0) -> Any:
        """The ``torch.device`` of device ``index`` (the registry's mapping)."""
        return self._live().device(index)

    def _module(self) -> Any:
        import torch

        return getattr(torch, self.device_type, None)

    def setup_device(self, device: Any) -> None:
        """Make ``device`` the current device of this process (the runtime's ``set_device``)."""
        import torch

        device = torch.device(device)
        if device.type == self.device_type:
            set_device = getattr(self._module(), "set_device", None)
            if set_device is not None and device.index is not None and self.device_type != "cpu":
                set_device(device)
            return
        if device.type == "cpu":
            return  # Lightning's own single-device choice for an accelerator it does not know; see setup()
        raise DeviceError(f"{self!r} cannot set up {device}: its devices are {self.device_type} devices")

    def setup(self, trainer: Any) -> None:
        """Called by the Trainer before the model is moved. Without ``install()``, Lightning gives
        an accelerator it does not know a single-device strategy on the *cpu* and autocasts on
        another device type; this moves that strategy, and its mixed precision, onto the
        backend's device (with ``install()`` the connector chose them right already)."""
        if self.device_type == "cpu":
            return
        strategy = trainer.strategy
        if type(strategy).__name__ != "SingleDeviceStrategy" or strategy.root_device.type != "cpu":
            return
        connector = getattr(trainer, "_accelerator_connector", None)
        devices = list(getattr(connector, "_parallel_devices", None) or ()) or [self.device(0)]
        strategy._root_device = devices[0]
        self.setup_device(devices[0])
        fix_precision(strategy.precision_plugin, self.device_type)
        log.info("accelreg: Lightning's single-device strategy moved from the cpu to %s", devices[0])

    def teardown(self) -> None:
        """Release the backend's cached memory (the runtime's ``empty_cache``, if it has one)."""
        empty_cache = getattr(self._module(), "empty_cache", None)
        if empty_cache is not None and self.device_type != "cpu":
            empty_cache()

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory of ``device`` from the backend's ``memory_info`` (free, total, used bytes) and
        the runtime's allocated bytes; empty for the cpu."""
        import torch

        device = torch.device(device)
        index = device.index or 0
        stats: dict[str, Any] = {}
        info = self._live().memory(index)
        if info is not None:
            stats.update(
                {
                    "memory.free_bytes": info.free,
                    "memory.total_bytes": info.total,
                    "memory.used_bytes": info.total - info.free,
                }
            )
        allocated = getattr(self._module(), "memory_allocated", None)
        if allocated is not None and self.device_type != "cpu":
            stats["memory.allocated_bytes"] = int(allocated(device))
        return stats


#: The attribute that tells an FSDP precision plugin the device type it autocasts on (read by the
#: ``FSDPPrecision.forward_context`` seam: Lightning's own says ``"cuda"``).
AUTOCAST_DEVICE = "_accelreg_autocast_device"


def fix_precision(plugin: Any, device_type: str) -> Any:
    """Point a Lightning ``MixedPrecision`` plugin that autocasts on another device type at
    ``device_type`` (and give a 16-bit plugin a gradient scaler for that type); an
    ``FSDPPrecision`` plugin is told the device type its mixed precision autocasts on, and its
    16-bit sharded gradient scaler is made for that type. Returns the plugin."""
    import torch

    if type(plugin).__name__ == "FSDPPrecision":
        setattr(plugin, AUTOCAST_DEVICE, device_type)
        scaler = getattr(plugin, "scaler", None)
        if scaler is not None and getattr(scaler, "_device", device_type) != device_type:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            plugin.scaler = ShardedGradScaler(device=device_type)
        return plugin
    if type(plugin).__name__ != "MixedPrecision" or getattr(plugin, "device", device_type) == device_type:
        return plugin
    plugin.device = device_type
    scaler = getattr(plugin, "scaler", None)
    if scaler is not None and getattr(scaler, "_device", device_type) != device_type:
        plugin.scaler = torch.amp.GradScaler(device=device_type)
    return plugin


def _has(b: Backend) -> str:
    names = ", ".join(b.info().devices()) or "none"
    return f"has {b.count} device{'s' if b.count != 1 else ''} ({names})"


def _count(devices: Any, backend: str) -> int:
    if isinstance(devices, bool):
        raise TypeError(f"devices={devices!r} is a bool, not a device count")
    if isinstance(devices, int):
        return devices
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        return int(devices.strip())
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    raise DeviceError(f"devices={devices!r}: {backend} takes a number of devices")


def _indices(devices: Any, count: int, backend: str) -> list[int]:
    if isinstance(devices, bool):
        raise TypeError(f"devices={devices!r} is a bool, not a device count or a list of indices")
    if isinstance(devices, int):
        return list(range(count)) if devices == -1 else list(range(devices)) if devices > 0 else []
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():  # "2": two devices (Lightning's reading), "-1": all
            return _indices(int(text), count, backend)
        parts = [p.strip() for p in text.split(",")]
        if parts and parts[-1] == "":
            parts = parts[:-1]  # "1," : device 1
        if parts and all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
        raise DeviceError(
            f"devices={devices!r} is not a device count or a comma-separated list of indices "
            f"such as '0,1' for {backend}"
        )
    if isinstance(devices, (list, tuple)):
        if all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
            return [int(i) for i in devices]
    raise TypeError(
        f"devices={devices!r}: expected an int, a string such as '0,1', or a list of device indices"
    )
