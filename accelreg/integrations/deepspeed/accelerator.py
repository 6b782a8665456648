"""DeepSpeed's accelerator interface, answered by the registry.

:func:`registry_accelerator` builds one object implementing DeepSpeed's ``DeepSpeedAccelerator``
for any registered backend — including one DeepSpeed has never heard of. Device names, count,
availability, memory totals, the collective backend and the visible-devices variable come from
the registry (the backend's plugin); streams, events, RNG, memory statistics and
synchronisation come from the backend's torch device module (``torch.<device_type>``), with
host-side fallbacks where a runtime lacks a function (the host generator for RNG, ``0`` for an
unknown statistic, a no-op ``synchronize``). DeepSpeed has no op builders for such a backend:
``get_op_builder``/``create_op_builder`` answer a stand-in builder that is never compatible
(so DeepSpeed's optional kernels stay off) and whose ``load()`` raises ``NotImplementedError``
naming the kernel and the torch alternative — never a builder for another device.

DeepSpeed's launcher asks the same object, in its own processes: ``device_count()`` (one rank
per device; it answers for the *current* value of the backend's visible-devices variable, which
DeepSpeed's runner removes after turning it into ``--include``), ``visible_devices_envs()`` /
``set_visible_devices_envs()`` (the backend's own variable; DeepSpeed's slot ids are positions
in a mask the node's launch process inherited, so ``accelreg run --devices`` is never widened
or replaced) and ``export_envs()`` (accelreg's settings, for the nodes it starts over ssh).

:func:`deepspeed_class_for` builds DeepSpeed's *own* class for a device type when DeepSpeed
ships one (the ``<type>_accelerator`` module next to DeepSpeed's abstract class), and
:func:`accelerator_for` makes the choice the integration hands to DeepSpeed; see
``docs/integrations.md`` for which and why.

This module imports DeepSpeed's abstract accelerator (``deepspeed.accelerator``) at first use.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ... import registry
from ...config import KEYS
from ...errors import DeviceError, IntegrationError
from ...resolution import current_in_use
from .._machinery.slots import slots_under_mask

__all__ = [
    "EXPORTED",
    "accelerator_for",
    "deepspeed_class_for",
    "deepspeed_ships_class",
    "keep_inherited_masks",
    "registry_accelerator",
]

#: accelreg's variables that DeepSpeed's runner exports to the nodes it starts over pdsh, ssh or
#: MPI (prefixes, as DeepSpeed matches them): the start-up switches (``ACCELREG_RUN``,
#: ``ACCELREG_AUTO_INSTALL``) and every configuration variable — a job's settings, not a
#: plugin's own variables (``ACCELREG_EMU_*``) or a mask: a node's devices are its own.
EXPORTED: tuple[str, ...] = (
    "ACCELREG_RUN",
    "ACCELREG_AUTO_INSTALL",
    "ACCELREG_CONFIG",
    *(key.env for key in KEYS.values()),
)

log = logging.getLogger("accelreg.integrations.deepspeed")

_ABSTRACT = "deepspeed.accelerator.abstract_accelerator"
_classes: dict[str, type] = {}


# -- DeepSpeed's own classes --------------------------------------------------------------
def _accelerator_dir() -> str | None:
    """DeepSpeed's ``accelerator`` package directory, found without importing DeepSpeed."""
    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "accelerator")
        if os.path.isdir(path):
            return path
    return None


def deepspeed_ships_class(device_type: str) -> bool:
    """Whether the installed DeepSpeed has its own accelerator class for ``device_type``
    (its ``deepspeed/accelerator/<type>_accelerator.py``); never imports DeepSpeed."""
    folder = _accelerator_dir()
    return (
        folder is not None
        and device_type.isidentifier()
        and os.path.isfile(os.path.join(folder, f"{device_type}_accelerator.py"))
    )


def deepspeed_class_for(device_type: str) -> Any | None:
    """An instance of DeepSpeed's own accelerator class for ``device_type``, or ``None`` when
    DeepSpeed ships none. Raises :class:`IntegrationError` when it ships one that cannot be
    built here."""
    if not deepspeed_ships_class(device_type):
        return None
    base = importlib.import_module(_ABSTRACT).DeepSpeedAccelerator
    name = f"deepspeed.accelerator.{device_type}_accelerator"
    try:
        module = importlib.import_module(name)
        found = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == name
        ]
        if len(found) != 1:
            raise IntegrationError(f"{name} defines {len(found)} accelerator classes, expected one")
        return found[0]()
    except IntegrationError:
        raise
    except Exception as exc:
        raise IntegrationError(
            f"deepspeed: DeepSpeed's own {device_type} accelerator cannot be built here: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


# -- DeepSpeed's launcher: slots and masks ---------------------------------------------------
def keep_inherited_masks(accelerator: Any, backend: str) -> None:
    """Make DeepSpeed's own accelerator class (an instance accelreg built for ``backend``) read
    DeepSpeed's slots as :func:`slots_under_mask` does, as the registry accelerator does: left
    alone it overwrites a mask the node's launch process inherited with the slot ids, another
    physical device. For a backend without a mask (the cpu) it hides the devices of the other
    backend whose variable DeepSpeed's cpu class sets (``""``), instead of listing slots there. Set on the instance; a no-op for the registry
    accelerator and for a class that masks another variable than the backend's."""
    if isinstance(accelerator, _RegistryAccelerator):
        return
    snap = registry.get()
    spec = snap.backend(backend).spec
    var = spec.visible_devices_var
    if var is None:
        # a backend without a mask (the cpu): DeepSpeed's cpu class "masks" its ranks with
        # CUDA_VISIBLE_DEVICES=<slots>, another backend's variable, which makes that backend look
        # present (and failing) to every rank. A cpu job uses none of that backend's devices: ""
        foreign = {b.spec.visible_devices_var for b in snap.order if b.spec.visible_devices_var}
        foreign &= set(accelerator.visible_devices_envs())
        if foreign:

            def hide(current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
                current_env.update(dict.fromkeys(foreign, ""))

            accelerator.set_visible_devices_envs = hide
        return
    if var not in accelerator.visible_devices_envs():
        return
    original = accelerator.set_visible_devices_envs

    def set_visible_devices_envs(current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        original(current_env, slots_under_mask(spec, current_env, local_accelerator_ids))

    accelerator.set_visible_devices_envs = set_visible_devices_envs


# -- the registry's accelerator -------------------------------------------------------------
def _typed(dtype: Any, device: Callable[[], str]) -> Callable[..., Any]:
    """A legacy ``torch.<dev>.FloatTensor``-style constructor on the current device."""
    import torch

    def make(*args: Any) -> Any:
        if len(args) == 1 and not isinstance(args[0], int):
            return torch.as_tensor(args[0], dtype=dtype, device=device())
        return torch.empty(*args, dtype=dtype, device=device())

    return make


def _no_kernel(class_name: str, backend: str) -> type:
    """A stand-in op builder: DeepSpeed has no kernel for ``class_name`` on ``backend``.

    It is never compatible (so DeepSpeed's optional ops, like the shared-memory all-reduce,
    stay off), and ``load()`` says what is missing instead of ``'NoneType' is not callable``.
    """

    def load(self: Any, verbose: bool = True) -> Any:
        raise NotImplementedError(
            f"DeepSpeed has no {class_name} kernel for the {backend} backend (it ships no accelerator "
            "class for it; accelreg's registry accelerator runs DeepSpeed there): use the torch "
            'implementation instead (for the optimizer: "torch_adam": true, or pass a torch optimizer)'
        )

    name = f"accelreg_unavailable_{class_name}"
    return type(
        class_name,
        (),
        {
            "NAME": name,
            "BUILD_VAR": f"DS_BUILD_{class_name.upper()}",
            "__init__": lambda self, name=name: setattr(self, "name", name),
            "absolute_name": lambda self: name,
            "is_compatible": lambda self, verbose=False: False,
            "sources": lambda self: [],
            "load": load,
            "__module__": __name__,
        },
    )


class _RegistryAccelerator:
    """The methods; :func:`registry_accelerator_class` mixes them into DeepSpeed's base."""

    supports_nvtx_domain = False

    def __init__(self, backend: str) -> None:
        import torch

        super().__init__()  # type: ignore[call-arg] - DeepSpeedAccelerator.__init__
        snap = registry.get()
        chosen = snap.backend(backend)
        if not chosen.available:
            raise DeviceError(f"{backend} is not available: {chosen.probe().availability.reason}")
        spec = chosen.spec
        self.backend = chosen.name
        self._name = chosen.device_type
        self._spec = spec
        self._communication_backend_name = spec.dist_backend
        self._compile_backend = "inductor"
        self._indexed = spec.indexed
        self._visible_var = spec.visible_devices_var
        self._count = chosen.count
        #: the mask the count was probed under, and counts taken since under other masks
        self._mask = snap.environ.get(self._visible_var) if self._visible_var else None
        self._counts: dict[str | None, int] = {self._mask: self._count}
        self._timeout = snap.settings.probe_timeout
        self._devices = tuple(chosen.device(i) for i in range(self._count))
        self._names = tuple(str(d) for d in self._devices)
        self._memory = chosen.memory
        self._available = chosen.available
        self._mod = getattr(torch, chosen.device_type, None)
        if self._mod is None:
            raise DeviceError(
                f"{backend}: torch.{chosen.device_type} does not exist; the backend's runtime must "
                "register its device module (torch._register_device_module) for DeepSpeed to use it"
            )
        self._torch = torch
        # what DeepSpeed calls hundreds of times per step, looked up once
        mod = self._mod
        self._current = getattr(mod, "current_device", None) or torch.accelerator.current_device_index
        self._synchronize = getattr(mod, "synchronize", None)
        self._current_stream = getattr(mod, "current_stream", None) or torch.accelerator.current_stream
        self._stream = getattr(mod, "stream", None)

    def _fn(self, name: str) -> Callable[..., Any] | None:
        return getattr(self._mod, name, None)

    def _call(self, name: str, default: Any, *args: Any) -> Any:
        fn = getattr(self._mod, name, None)
        return default if fn is None else fn(*args)

    def __repr__(self) -> str:
        return f"<accelreg registry accelerator for {self.backend} ({self._name}), {self._count} device(s)>"

    # -- execution model: an accelerator runs asynchronously to the host
    def is_synchronized_device(self) -> bool:
        return False

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    # -- devices: the registry
    def _check(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self._count:
            devices = ", ".join(self._names) or "none"
            raise DeviceError(
                f"{self.backend} device index {index!r} is out of range: it has {self._count} "
                f"device(s) ({devices})"
            )
        return index

    def device_name(self, device_index: int | None = None) -> str:
        if device_index is None:
            return self._name
        return self._names[self._check(int(device_index))]

    def device(self, device_index: int | None = None) -> Any:
        if device_index is None:
            return self._torch.device(self._name)
        return self._devices[self._check(int(device_index))]

    def set_device(self, device_index: Any) -> None:
        fn = self._fn("set_device")
        if fn is not None:
            fn(device_index)

    def current_device(self) -> int:
        if not self._indexed:
            return 0
        return int(self._current())

    def current_device_name(self) -> str:
        if not self._indexed:
            return self._name
        return self._names[int(self._current())]

    def device_count(self) -> int:
        """Devices under the backend's visible-devices variable as it is *now*. DeepSpeed's runner
        turns a mask into ``--include`` and removes it before it counts a node's slots, as if
        the runtime had not started yet; a runtime reads its mask once, so a count under another
        mask is taken in a fresh interpreter (once per value)."""
        var = self._visible_var
        mask = os.environ.get(var) if var else None
        if mask not in self._counts:
            self._counts[mask] = self._count_elsewhere()
        return self._counts[mask]

    def _count_elsewhere(self) -> int:
        env = {k: v for k, v in os.environ.items() if k not in ("ACCELREG_RUN", "ACCELREG_AUTO_INSTALL")}
        code = "import sys, accelreg; print(accelreg.device_count(sys.argv[1]))"
        mask = os.environ.get(self._visible_var or "")
        where = f"{self.backend}: counting its devices under {self._visible_var}={mask!r}"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code, self.backend],
                env=env,
                capture_output=True,
                text=True,
                timeout=2 * self._timeout + 30,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            raise DeviceError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        words = proc.stdout.split()
        if proc.returncode != 0 or not words or not words[-1].isdecimal():
            raise DeviceError(f"{where} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return int(words[-1])

    def synchronize(self, device_index: int | None = None) -> None:
        if self._synchronize is not None:
            self._synchronize(device_index)

    # -- RNG: the device module's, else the host generator's
    def random(self) -> Any:
        return self._torch.random

    def set_rng_state(self, new_state: Any, device_index: int | None = None) -> None:
        fn = self._fn("set_rng_state")
        if fn is None:
            self._torch.set_rng_state(new_state)
        elif device_index is None:
            fn(new_state)
        else:
            fn(new_state, device_index)

    def get_rng_state(self, device_index: int | None = None) -> Any:
        fn = self._fn("get_rng_state")
        if fn is None:
            return self._torch.get_rng_state()
        return fn() if device_index is None else fn(device_index)

    def manual_seed(self, seed: int) -> Any:
        return (self._fn("manual_seed") or self._torch.manual_seed)(seed)

    def manual_seed_all(self, seed: int) -> Any:
        return (self._fn("manual_seed_all") or self.manual_seed)(seed)

    def initial_seed(self) -> int:
        return int((self._fn("initial_seed") or self._torch.initial_seed)())

    def default_generator(self, device_index: int) -> Any:
        generators = getattr(self._mod, "default_generators", None)
        if generators:
            return generators[device_index]
        return self._torch.default_generator

    # -- streams and events: the device module's, else torch's generic ones
    @property
    def Stream(self) -> Any:
        return getattr(self._mod, "Stream", None) or self._torch.Stream

    def stream(self, stream: Any) -> Any:
        if self._stream is None:
            return contextlib.nullcontext(stream)
        return self._stream(stream)

    def current_stream(self, device_index: int | None = None) -> Any:
        return self._current_stream(device_index)

    def default_stream(self, device_index: int | None = None) -> Any:
        fn = self._fn("default_stream")
        return fn(device_index) if fn is not None else self.current_stream(device_index)

    @property
    def Event(self) -> Any:
        return getattr(self._mod, "Event", None) or self._torch.Event

    # -- memory: totals from the registry (the plugin's memory_info), statistics from torch
    def empty_cache(self) -> None:
        self._call("empty_cache", None)

    def memory_allocated(self, device_index: int | None = None) -> int:
        return int(self._call("memory_allocated", 0, device_index))

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return int(self._call("max_memory_allocated", 0, device_index))

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        fn = self._fn("reset_max_memory_allocated") or self._fn("reset_peak_memory_stats")
        if fn is not None:
            fn(device_index)

    def memory_cached(self, device_index: int | None = None) -> int:
        return self.memory_reserved(device_index)

    def max_memory_cached(self, device_index: int | None = None) -> int:
        return self.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index: int | None = None) -> None:
        self.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]:
        return dict(self._call("memory_stats", {}, device_index) or {})

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        self._call("reset_peak_memory_stats", None, device_index)

    def memory_reserved(self, device_index: int | None = None) -> int:
        return int(self._call("memory_reserved", 0, device_index))

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return int(self._call("max_memory_reserved", 0, device_index))

    def _index(self, device_index: int | None) -> int:
        if device_index is None:
            return self.current_device()
        return self._check(int(device_index))

    def total_memory(self, device_index: int | None = None) -> int:
        info = self._memory(self._index(device_index))
        if info is not None:
            return info.total
        props = self._fn("get_device_properties")
        return int(props(self._index(device_index)).total_memory) if props is not None else 0

    def available_memory(self, device_index: int | None = None) -> int:
        info = self._memory(self._index(device_index))
        if info is not None:
            return info.free
        return max(self.total_memory(device_index) - self.memory_allocated(device_index), 0)

    # -- data types
    def is_bf16_supported(self) -> bool:
        fn = self._fn("is_bf16_supported")
        return bool(fn()) if fn is not None else True

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[Any]:
        t = self._torch
        return [t.float32, t.float16] + ([t.bfloat16] if self.is_bf16_supported() else [])

    # -- misc
    def is_available(self) -> bool:
        return self._available

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        return None

    def range_pop(self, domain: Any = None) -> None:
        return None

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        fn = self._fn("_lazy_call")
        return fn(callback) if fn is not None else callback()

    def communication_backend_name(self) -> str | None:
        return self._communication_backend_name

    def is_triton_supported(self) -> bool:
        return False

    # -- graphs: not offered generically
    def create_graph(self) -> Any:
        raise NotImplementedError(f"accelreg's DeepSpeed accelerator offers no graph capture on {self._name}")

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        raise NotImplementedError(f"accelreg's DeepSpeed accelerator offers no graph capture on {self._name}")

    def replay_graph(self, graph: Any) -> None:
        raise NotImplementedError(f"accelreg's DeepSpeed accelerator offers no graph capture on {self._name}")

    # -- legacy typed-tensor constructors
    def _tensor_type(self, name: str, dtype: Any) -> Any:
        found = getattr(self._mod, name, None)
        return found if found is not None else _typed(dtype, self.current_device_name)

    @property
    def BFloat16Tensor(self) -> Any:
        return self._tensor_type("BFloat16Tensor", self._torch.bfloat16)

    @property
    def ByteTensor(self) -> Any:
        return self._tensor_type("ByteTensor", self._torch.uint8)

    @property
    def DoubleTensor(self) -> Any:
        return self._tensor_type("DoubleTensor", self._torch.float64)

    @property
    def FloatTensor(self) -> Any:
        return self._tensor_type("FloatTensor", self._torch.float32)

    @property
    def HalfTensor(self) -> Any:
        return self._tensor_type("HalfTensor", self._torch.float16)

    @property
    def IntTensor(self) -> Any:
        return self._tensor_type("IntTensor", self._torch.int32)

    @property
    def LongTensor(self) -> Any:
        return self._tensor_type("LongTensor", self._torch.int64)

    # -- pinned host memory (DeepSpeed >= 0.18 dispatches through these)
    def _torch_pin_memory(self, tensor: Any) -> Any:
        return tensor.pin_memory()

    def _torch_is_pinned(self, tensor: Any) -> bool:
        return bool(tensor.is_pinned())

    def on_accelerator(self, tensor: Any) -> bool:
        return tensor.device.type == self._name

    # -- op builders: DeepSpeed has none for a backend it has no class for
    def op_builder_dir(self) -> str:
        return "deepspeed.ops.op_builder"

    def create_op_builder(self, class_name: str) -> Any:
        return self.get_op_builder(class_name)()

    def get_op_builder(self, class_name: str) -> Any:
        return _no_kernel(class_name, self.backend)

    def build_extension(self) -> Any:
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension

    def export_envs(self) -> list[str]:
        """Prefixes of the variables DeepSpeed's runner exports to other nodes: accelreg's
        (:data:`EXPORTED`) and, as DeepSpeed's own vendor accelerators do, the library paths."""
        return [*EXPORTED, "LD_LIBRARY", "PATH"]

    def visible_devices_envs(self) -> list[str]:
        return [self._visible_var] if self._visible_var else []

    def set_visible_devices_envs(self, current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        """Give this node's ranks devices ``local_accelerator_ids`` (DeepSpeed's slots) through the
        backend's variable. Under a mask the process inherited (``accelreg run --devices 1,3``)
        slot ``i`` is the mask's ``i``-th device: the job never leaves the devices it was given.
        Raises :class:`DeviceError` for a slot the mask does not have, and for slots other than
        ``0..n-1`` on a backend without a visible-devices variable (nothing could select them)."""
        ids = [str(i) for i in local_accelerator_ids]
        var = self._visible_var
        if var is None:
            if ids != [str(i) for i in range(len(ids))]:
                raise DeviceError(
                    f"{self.backend} has no visible-devices variable: DeepSpeed cannot give this node's "
                    f"ranks devices {', '.join(ids)} (each rank uses device LOCAL_RANK, so only 0..n-1)"
                )
            return
        current_env[var] = ",".join(slots_under_mask(self._spec, current_env, ids))

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        supported = self._torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(f"{backend} not supported by {self._name}. Supported backends are {supported}")
        self._compile_backend = backend


class _Before018:
    """Abstract in DeepSpeed < 0.18 (concrete, with other signatures, in later releases)."""

    def amp(self) -> Any:
        return getattr(self._mod, "amp", None)  # type: ignore[attr-defined]

    def pin_memory(self, tensor: Any, align_bytes: int = 1) -> Any:
        return tensor.pin_memory()

    def is_pinned(self, tensor: Any) -> bool:
        return bool(tensor.is_pinned())


def registry_accelerator_class() -> type:
    """The registry's accelerator class, a subclass of the installed DeepSpeed's
    ``DeepSpeedAccelerator`` (built once). Raises :class:`IntegrationError` when that
    interface has abstract methods accelreg does not implement."""
    base = importlib.import_module(_ABSTRACT).DeepSpeedAccelerator
    cls = _classes.get(base.__module__ + "." + base.__qualname__ + str(id(base)))
    if cls is not None:
        return cls
    abstract = set(getattr(base, "__abstractmethods__", ()))
    mixins: tuple[type, ...] = (_RegistryAccelerator,)
    if abstract & set(vars(_Before018)):
        mixins += (_Before018,)
    cls = type("RegistryAccelerator", (*mixins, base), {"__module__": __name__})
    abc.update_abstractmethods(cls)
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise IntegrationError(
            "deepspeed: this DeepSpeed's accelerator interface has abstract methods accelreg does not "
            f"implement: {', '.join(missing)} (upgrade accelreg, or pin DeepSpeed)"
        )
    _classes[base.__module__ + "." + base.__qualname__ + str(id(base))] = cls
    return cls


def registry_accelerator(backend: str | None = None) -> Any:
    """The registry's DeepSpeed accelerator for ``backend`` (default: the current backend).

    Raises :class:`DeviceError` for an unknown or unavailable backend.
    """

    name = backend if backend is not None else current_in_use(registry.get()).name
    return registry_accelerator_class()(name)


def accelerator_for(backend: str | None = None) -> Any:
    """What the integration hands DeepSpeed for ``backend`` (default: the current backend):
    DeepSpeed's own class for the backend's device type where DeepSpeed ships one, else the
    registry's accelerator. Either way the registry chose the backend."""

    snap = registry.get()
    chosen = current_in_use(snap) if backend is None else snap.backend(backend)
    if not chosen.available:
        raise DeviceError(f"{chosen.name} is not available: {chosen.probe().availability.reason}")
    own = deepspeed_class_for(chosen.device_type)
    if own is not None:
        return own
    return registry_accelerator(chosen.name)
