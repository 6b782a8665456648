"""The device module registered as ``torch.<name>`` (``torch.npu``, ``torch.emu``, ...).

It offers what frameworks call on a vendor runtime module: device selection, memory
figures, synchronisation, RNG, streams and events. Kernels run synchronously on the host,
so synchronisation is a no-op, streams are ids and events are timestamps; and since every
kernel draws random numbers from the host's default generator, the device RNG *is* that
generator (``manual_seed`` seeds it, ``get_rng_state`` returns its state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._config import EmuConfig

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "init",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
    "seed",
    "set_device",
    "set_rng_state",
    "stream",
    "synchronize",
]

_ops: Any = None
_config: EmuConfig | None = None
_name = "emu"


def _bind(config: EmuConfig) -> None:
    """Attach the module to the loaded extension (called once by ``activate``)."""
    global _ops, _config, _name, default_generators
    _ops = torch.ops.accelreg_emu
    _config = config
    _name = config.name or "emu"
    default_generators = (torch.default_generator,) * config.device_count
    _install_submodules()


def _install_submodules() -> None:
    """``torch.<name>.random``, ``.amp`` and the legacy typed-tensor constructors."""
    import sys
    import types

    from ._shim import typed_tensor

    me = sys.modules[__name__]
    random = types.ModuleType(f"torch.{_name}.random", "RNG of the emulated device (the host's).")
    for fn in (
        manual_seed,
        manual_seed_all,
        seed,
        seed_all,
        initial_seed,
        get_rng_state,
        get_rng_state_all,
        set_rng_state,
        set_rng_state_all,
    ):
        setattr(random, fn.__name__, fn)
    amp = types.ModuleType(f"torch.{_name}.amp", "Mixed precision on the emulated device.")

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(_name, *args, **kwargs)

    def autocast(dtype: torch.dtype = torch.float16, enabled: bool = True, cache_enabled: bool = True) -> Any:
        return torch.autocast(_name, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    amp.GradScaler = GradScaler  # type: ignore[attr-defined]
    amp.autocast = autocast  # type: ignore[attr-defined]
    me.random = random  # type: ignore[attr-defined]
    me.amp = amp  # type: ignore[attr-defined]
    sys.modules[random.__name__] = random
    sys.modules[amp.__name__] = amp
    for cls_name, dtype in (
        ("FloatTensor", torch.float32),
        ("DoubleTensor", torch.float64),
        ("HalfTensor", torch.float16),
        ("BFloat16Tensor", torch.bfloat16),
        ("ByteTensor", torch.uint8),
        ("CharTensor", torch.int8),
        ("ShortTensor", torch.int16),
        ("IntTensor", torch.int32),
        ("LongTensor", torch.int64),
        ("BoolTensor", torch.bool),
    ):
        setattr(me, cls_name, typed_tensor(_name, dtype, cls_name))


def _index(dev: Any = None) -> int:
    """Device index of an int, ``"npu:1"``, ``torch.device`` or ``None`` (current device)."""
    if dev is None:
        return int(_ops.current_device())
    if isinstance(dev, bool):
        raise TypeError(f"invalid device {dev!r}")
    if isinstance(dev, int):
        index = dev
    else:
        d = torch.device(dev) if isinstance(dev, str) else dev
        if not isinstance(d, torch.device):
            raise TypeError(f"invalid device {dev!r}")
        if d.type != _name:
            raise ValueError(f"expected a {_name} device, got {d}")
        if d.index is None:
            return int(_ops.current_device())
        index = d.index
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"Invalid device index {index}: {_name} has {device_count()} device(s) (accelreg-emu)"
        )
    return index


# ---------------------------------------------------------------- devices


def is_available() -> bool:
    """Whether there is at least one (emulated) device."""
    return device_count() > 0


def device_count() -> int:
    """Number of logical devices (after the visible-devices mask)."""
    return int(_ops.device_count()) if _ops is not None else 0


def current_device() -> int:
    """Index of the calling thread's current device."""
    return int(_ops.current_device())


def set_device(dev: Any) -> None:
    """Make ``dev`` (int, ``"npu:1"``, ``torch.device``) the current device of this thread."""
    _ops.set_device(_index(dev))


class device:
    """Context manager that changes the current device, like ``torch.cuda.device``."""

    def __init__(self, dev: Any) -> None:
        self.idx = -1 if dev is None or (isinstance(dev, int) and dev < 0) else _index(dev)
        self.prev_idx = -1

    def __enter__(self) -> device:
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _ops.set_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0 and self.prev_idx != self.idx:
            _ops.set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor) current."""

    def __init__(self, obj: Any) -> None:
        idx = (
            obj.get_device() if getattr(obj, "device", None) is not None and obj.device.type == _name else -1
        )
        super().__init__(idx)


def is_initialized() -> bool:
    return _ops is not None


def init() -> None:
    """Nothing to initialise beyond ``activate()``; present because frameworks call it."""


_lazy_init = init


def _is_in_bad_fork() -> bool:
    return False


def synchronize(dev: Any = None) -> None:
    """Wait for the device: work is synchronous, so only validates ``dev``."""
    _index(dev)


def get_device_name(dev: Any = None) -> str:
    return f"accelreg-emu {_name.upper()} {_index(dev)} (emulated on the host)"


@dataclass(frozen=True)
class DeviceProperties:
    """What ``get_device_properties`` returns (the fields frameworks read)."""

    name: str
    total_memory: int
    major: int = 1
    minor: int = 0
    multi_processor_count: int = 1
    is_integrated: bool = False
    type: str = "emulated"


def get_device_properties(dev: Any = None) -> DeviceProperties:
    index = _index(dev)
    return DeviceProperties(name=get_device_name(index), total_memory=int(_ops.capacity(index)))


def get_device_capability(dev: Any = None) -> tuple[int, int]:
    props = get_device_properties(dev)
    return props.major, props.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """dtypes ``torch.autocast(device_type=<name>)`` accepts."""
    return [torch.float16, torch.bfloat16, torch.float32]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled(_name)


# ---------------------------------------------------------------- memory


def mem_get_info(dev: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device: capacity minus live allocations, capacity."""
    index = _index(dev)
    total = int(_ops.capacity(index))
    return max(total - int(_ops.memory_allocated(index)), 0), total


def memory_allocated(dev: Any = None) -> int:
    """Bytes held by live tensors on the device."""
    return int(_ops.memory_allocated(_index(dev)))


def max_memory_allocated(dev: Any = None) -> int:
    """Peak of ``memory_allocated`` since start or the last ``reset_peak_memory_stats``."""
    return int(_ops.max_memory_allocated(_index(dev)))


def memory_reserved(dev: Any = None) -> int:
    """Bytes reserved: the emulator caches nothing, so this equals ``memory_allocated``."""
    return memory_allocated(dev)


def max_memory_reserved(dev: Any = None) -> int:
    return max_memory_allocated(dev)


def reset_peak_memory_stats(dev: Any = None) -> None:
    _ops.reset_peak_memory_stats(_index(dev))


def reset_max_memory_allocated(dev: Any = None) -> None:
    reset_peak_memory_stats(dev)


def reset_accumulated_memory_stats(dev: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(dev))


def memory_stats(dev: Any = None) -> dict[str, Any]:
    """The allocator's statistics in ``torch.cuda.memory_stats`` key style, plus the keys
    Habana's ``torch.hpu.memory_stats`` has (``Limit``, ``InUse``, ``MaxInUse``, ``NumAllocs``)."""
    index = _index(dev)
    stats = dict(torch.accelerator.memory_stats(index))
    stats.update(
        Limit=int(_ops.capacity(index)),
        InUse=int(_ops.memory_allocated(index)),
        MaxInUse=int(_ops.max_memory_allocated(index)),
        NumAllocs=int(_ops.live_allocations(index)),
    )
    return stats


def empty_cache() -> None:
    """Nothing is cached: freed memory returns to the budget at once."""


def set_per_process_memory_fraction(fraction: float, dev: Any = None) -> None:
    """Limit the device to ``fraction`` of its configured capacity."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    assert _config is not None
    index = _index(dev)
    _ops.set_capacity(index, int(_config.capacities[index] * fraction))


# ---------------------------------------------------------------- RNG (the host generator)


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(dev: Any = None) -> torch.Tensor:
    _index(dev)
    return torch.default_generator.get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, dev: Any = None) -> None:
    _index(dev)
    torch.default_generator.set_state(new_state.cpu() if new_state.device.type != "cpu" else new_state)


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---------------------------------------------------------------- streams and events


class _OfThisDevice(type):
    """``isinstance(x, torch.<name>.Stream)``: a ``torch.Stream`` of this device type."""

    _base: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._base) and obj.device.type == _name


class Stream(metaclass=_OfThisDevice):
    """``torch.<name>.Stream(device=None, priority=0)``: a ``torch.Stream`` of this device.

    The constructor returns a plain ``torch.Stream``: torch's stream and event methods
    accept only exact ``torch.Stream``/``torch.Event`` objects. Work is synchronous, so a
    stream is an id and waiting on it returns at once.
    """

    _base = torch.Stream

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # type: ignore[misc]
        return torch.Stream(device=torch.device(_name, _index(device)), priority=priority)


class Event(metaclass=_OfThisDevice):
    """``torch.<name>.Event(enable_timing=False, blocking=False, interprocess=False)``.

    Returns a plain ``torch.Event`` on the current device (a timestamp when recorded).
    """

    _base = torch.Event

    def __new__(  # type: ignore[misc]
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> torch.Event:
        return torch.Event(
            device=torch.device(_name, current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(dev: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(dev))


# c10::DeviceType values (c10/core/DeviceType.h) of the two types the emulator can take.
_DEVICE_TYPE_ENUM = {"hpu": 15}
_PRIVATEUSE1_ENUM = 20


def default_stream(dev: Any = None) -> torch.Stream:
    index = _index(dev)
    kind = _DEVICE_TYPE_ENUM.get(_name, _PRIVATEUSE1_ENUM)
    return torch.Stream(stream_id=0, device_index=index, device_type=kind)


def set_stream(s: torch.Stream) -> None:
    torch.accelerator.set_stream(s)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[torch.Stream | None]:
    """Make ``s`` the current stream of its device inside the block (``None``: no change)."""
    if s is None:
        yield None
        return
    prev = torch.accelerator.current_stream(s.device_index)
    torch.accelerator.set_stream(s)
    try:
        yield s
    finally:
        torch.accelerator.set_stream(prev)


class StreamContext:
    """Class form of :func:`stream`, like ``torch.cuda.StreamContext``."""

    def __init__(self, s: torch.Stream | None) -> None:
        self._cm = stream(s)

    def __enter__(self) -> torch.Stream | None:
        return self._cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


# ---------------------------------------------------------------- odds and ends frameworks touch


def _lazy_call(callable_: Any, **kwargs: Any) -> None:
    """Run ``callable_`` now: the emulated runtime is always initialised."""
    callable_()


def memory_cached(dev: Any = None) -> int:
    return memory_reserved(dev)


def max_memory_cached(dev: Any = None) -> int:
    return max_memory_reserved(dev)


def reset_max_memory_cached(dev: Any = None) -> None:
    reset_peak_memory_stats(dev)


def utilization(dev: Any = None) -> int:
    _index(dev)
    return 0


default_generators: tuple[torch.Generator, ...] = ()
