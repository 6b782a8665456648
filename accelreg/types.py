"""Frozen records that cross the plugin boundary.

Plugins yield :class:`BackendSpec` and :class:`PlacementRule`; accelreg hands back
:class:`BackendInfo`, :class:`PluginFailure`, :class:`MemoryInfo` and :class:`Capabilities`
(with a :class:`DtypeSupport` per dtype). Nothing else crosses:
no plugin ever sees accelreg's internals, and accelreg never relies on a plugin's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from .dtypes import dtype_name
from .errors import DeviceError

if TYPE_CHECKING:
    import torch

__all__ = [
    "Availability",
    "BackendInfo",
    "BackendSpec",
    "Capabilities",
    "DtypeAnswer",
    "DtypeSupport",
    "HardwareSignature",
    "MemoryInfo",
    "PlacementRule",
    "PluginFailure",
    "ProbeResult",
]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be used in this process, and why (or why not).

    ``reason`` is shown to users verbatim by ``accelreg env``: make it say what to do,
    e.g. ``"torch_npu is not installed"`` or ``"torch.xpu reports no devices"``.
    """

    available: bool
    reason: str

    @classmethod
    def yes(cls, reason: str = "available") -> Availability:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


#: What an availability probe may return: an :class:`Availability`, a bare ``bool``, or a
#: ``(bool, reason)`` pair. accelreg normalises all three.
ProbeResult = Union[Availability, bool, "tuple[bool, str]"]


#: What a plugin says about one dtype (``BackendSpec.dtypes``): ``True`` or ``False``, ``None``
#: (not saying: accelreg asks the runtime, else answers unknown), or one of those with a
#: reason, ``(False, "compute capability 7.0 < 8.9")``.
DtypeAnswer = Union[bool, None, "tuple[bool | None, str]"]


@dataclass(frozen=True)
class MemoryInfo:
    """Free and total bytes of one device, as its runtime reports them."""

    free: int
    total: int


@dataclass(frozen=True)
class HardwareSignature:
    """How to see a backend's hardware on a machine whose runtime (or plugin) is missing.

    Data, not code: accelreg itself looks for the device nodes, files and PCI devices it names,
    under a root folder (``"/"``; tests pass a temporary one), without importing anything and
    without a probe thread. ``accelreg env`` asks it only for a backend that is unavailable,
    and names the hardware it finds with :attr:`install`. It never changes what ``resolve()``
    answers (that is :attr:`BackendSpec.presence`'s and ``runtime_package``'s job).

    Attributes:
        what: The hardware in words, as ``accelreg env`` names it (``"Huawei Ascend NPU"``).
        install: What to install to use it (``"torch_npu (pip install torch-npu) with Ascend's
            CANN toolkit"``).
        device_nodes: Absolute glob patterns of device nodes its kernel driver creates
            (``"/dev/davinci[0-9]*"``): seen when the driver is loaded.
        files: Absolute paths (or glob patterns) of files its driver creates
            (``"/proc/driver/nvidia/version"``).
        pci_vendors: PCI vendor ids (``"0x19e5"``), read from
            ``/sys/bus/pci/devices/*/vendor``: seen with or without a driver.
        pci_classes: PCI class code prefixes (``"0x12"``: processing accelerators, ``"0x0302"``:
            3D controllers) a device of :attr:`pci_vendors` must have to count; empty counts
            every device of those vendors.
    """

    what: str
    install: str = ""
    device_nodes: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    pci_vendors: tuple[str, ...] = ()
    pci_classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSpec:
    """One backend, as a plugin declares it (what accelreg reports back is :class:`BackendInfo`;
    the registry's live object behind both is ``accelreg.registry.Backend``, internal).

    Only ``name``, ``priority``, ``is_available`` and ``device_count`` are required. Every
    callable is a *probe*: accelreg calls it lazily, at most once per registry build (except
    ``memory_info``, which reports live figures), contains whatever it raises and turns that
    into "unavailable, because ...". Probes must not import a vendor package that
    ``importlib.util.find_spec`` says is absent.

    Attributes:
        name: Backend name, also the entry-point name (``"npu"``). Lower case, ``[a-z0-9_]``.
        priority: Default priority; the highest available backend is the current one unless
            configuration says otherwise. Built-ins use 10-100; ``cpu`` is always last.
        is_available: ``() -> Availability | bool | (bool, str)``.
        device_count: ``() -> int``, the number of devices this process can address.
        device_type: The torch device type, when it differs from ``name``.
        visible_devices_var: The environment variable that masks devices
            (``"ASCEND_RT_VISIBLE_DEVICES"``), or ``None``.
        current_index: ``() -> int``, the runtime's current device index (default 0).
        device: ``(index) -> torch.device``; default ``torch.device(device_type, index)``.
            A backend that addresses devices without an index (hpu) returns
            ``torch.device("hpu")`` and sets ``indexed=False``.
        memory_info: ``(index) -> MemoryInfo | None``, free/total bytes of one device.
        parse_visible_devices: ``(value) -> tuple[str, ...]``, the physical ids behind each
            logical index for a value of ``visible_devices_var``; the default parser handles
            comma-separated ids.
        indexed: Whether device strings carry an index (``"npu:0"``) or not (``"hpu"``).
        description: One line for ``accelreg env``.
        runtime_package: Import name of the vendor package that provides the runtime
            (``"torch_npu"``), or ``None`` when the runtime ships with torch. When it is
            installed the backend counts as *present*: if its probes then say unavailable,
            ``resolve()`` warns instead of falling back to ``cpu`` silently, and refuses the
            fallback under a launcher (see docs/reliability.md).
        dist_backend: The ``torch.distributed`` backend that runs collectives on this
            backend's tensors (``"nccl"``, ``"hccl"``, ``"xccl"``, ``"cncl"``, ``"gloo"``, ...),
            as passed to ``init_process_group``; ``None`` when the runtime has none.
            :func:`accelreg.dist_backend` answers it, so frameworks need no ``"nccl"`` ladder.
        presence: ``() -> str | None``, for a runtime that ships with torch (so has no
            ``runtime_package``): why this backend's hardware or driver is on this machine even
            though its probes fail (``"the NVIDIA kernel driver is loaded"``), else ``None``.
            Asked only when the backend is unavailable; a non-``None`` answer makes passing it
            over loud, like an installed ``runtime_package``.
        versions: ``() -> Mapping[str, str]``, the versions of the runtime behind this backend
            that a bug report needs, by what they are: ``{"torch_npu": "2.13.0", "CANN":
            "8.1.RC1", "driver": "24.1.0"}``. Asked by ``accelreg env`` whether or not the
            backend is available (a driver that does not match the runtime is a common reason
            it is not), so it must stay cheap and must not import a vendor package that is not
            installed; leave out what the runtime cannot say. At most 16 entries, keys of at
            most 64 characters, values of at most 200.
        device_name: ``(index) -> str``, the product name of one device
            (``"Ascend 910B2"``, ``"NVIDIA H100 80GB HBM3"``), as ``accelreg env`` shows it.
            Asked only for available backends and indices below the device count.
        ray_resource: The name this backend's devices carry as a Ray resource, when it is not
            the backend name upper-cased: Ray's own name for a device family Ray already
            schedules (the built-in cuda and xpu backends declare ``"GPU"``), or a vendor's
            choice. accelreg's Ray integration offers the backend's devices to Ray under it
            (docs/scaling.md). Letters, digits and ``_``; not one of Ray's own non-accelerator
            resources (``CPU``, ``memory``, ``object_store_memory``).
        gres: The Slurm GRES names (generic resource types, ``Gres=npu:8`` in ``slurm.conf``)
            this backend's devices are declared as on a cluster, in order of preference:
            ``None`` means the backend name (``("acme",)``); add ``"gpu"`` when sites declare
            your devices as Slurm's ``gpu`` type (the built-in npu, mlu, musa and sdaa declare
            ``(name, "gpu")``; cuda and xpu ``("gpu",)``); ``()`` for devices Slurm never hands
            out. Under ``accelreg run`` in a Slurm task, the devices Slurm allocated of the first
            name the task has become the backend's visible-devices mask (docs/scaling.md,
            "Slurm"). Letters, digits and ``_``, at most 8 names.
        hardware: A :class:`HardwareSignature`: how to see this backend's hardware without
            its runtime (device nodes, PCI vendor ids, driver files), so that ``accelreg env``
            names hardware that is present while the runtime or plugin that would use it is
            missing, with what to install. ``None``: the hardware cannot be seen that way.
        vllm_platform: The vLLM platform that serves this backend, or several tried in order
            (the first that vLLM finds active here): the name of one of vLLM's own platforms
            (``"cuda"``, ``"rocm"``, ``"xpu"``, ``"tpu"``, ``"cpu"``), the entry-point name of a
            platform plugin in vLLM's ``vllm.platform_plugins`` group (``"ascend"`` for vllm-ascend,
            ``"hpu"`` for vllm-gaudi), a platform class path (``"vllm_acme.platform.AcmePlatform"``),
            or ``"registry"``. ``None``, or none of the names installed: the one active platform
            plugin whose platform's ``device_type`` is this backend's torch device type serves
            it (two are an error), else (``None``) accelreg's registry platform (vLLM on the
            backend's devices with torch's own operators; docs/integrations.md, "vLLM"). The
            registry keeps it as a tuple of names.
        dtypes: Which dtypes the devices compute in (what that means: :mod:`accelreg.dtypes`),
            as :func:`accelreg.capabilities` answers it: a mapping declared once
            (``{"bfloat16": True, "float16": True, "float8_e4m3fn": False}``), or a probe
            ``(index) -> mapping`` for device ``index``, asked at most once per device per
            registry build and only while the backend is available. Keys are torch's dtype
            names or ``torch.dtype`` objects; values are :data:`DtypeAnswer`. A dtype left out
            (or ``None``) is asked of the runtime: ``torch.<device_type>.is_bf16_supported()``
            for bfloat16, ``torch.<device_type>.get_amp_supported_dtype()`` for bfloat16 and
            float16, where they exist; else the answer is unknown, never ``False``. A probe that
            raises or answers nonsense is recorded, and that device's answers are unknown,
            saying why. At most 32 entries; reasons of at most 200 characters.
    """

    name: str
    priority: int
    is_available: Callable[[], ProbeResult]
    device_count: Callable[[], int]
    device_type: str | None = None
    visible_devices_var: str | None = None
    current_index: Callable[[], int] | None = None
    device: Callable[[int], torch.device] | None = None
    memory_info: Callable[[int], MemoryInfo | None] | None = None
    parse_visible_devices: Callable[[str], Sequence[str]] | None = None
    indexed: bool = True
    description: str = ""
    runtime_package: str | None = None
    dist_backend: str | None = None
    presence: Callable[[], str | None] | None = None
    versions: Callable[[], Mapping[str, str]] | None = None
    device_name: Callable[[int], str] | None = None
    ray_resource: str | None = None
    gres: tuple[str, ...] | None = None
    hardware: HardwareSignature | None = None
    vllm_platform: str | tuple[str, ...] | None = None
    dtypes: Mapping[Any, DtypeAnswer] | Callable[[int], Mapping[Any, DtypeAnswer]] | None = None

    @property
    def torch_type(self) -> str:
        """The torch device type this backend's devices carry."""
        return self.device_type or self.name

    @property
    def ray_resource_name(self) -> str:
        """The Ray resource this backend's devices are offered as: :attr:`ray_resource`, else
        the backend name upper-cased (``"MLU"``)."""
        return self.ray_resource or self.name.upper()

    @property
    def gres_names(self) -> tuple[str, ...]:
        """The Slurm GRES names this backend's devices carry: :attr:`gres`, else the backend
        name alone (``("mlu", "gpu")``, ``("acme",)``)."""
        return (self.name,) if self.gres is None else tuple(self.gres)


@dataclass(frozen=True)
class BackendInfo:
    """A registered backend as accelreg sees it after selection (what ``backends()`` returns): a
    frozen report, with the probes' answers, of what a plugin declared as a :class:`BackendSpec`.

    Attributes:
        name: Backend name.
        device_type: torch device type of its devices.
        priority: Default priority the plugin declared.
        position: Place in the effective order (0 = tried first).
        available: Whether it can be used here.
        reason: Why (not), in words.
        device_count: Devices this process can address (0 when unavailable).
        provider: Distribution that provides it (``"accelreg"`` for built-ins).
        provider_version: That distribution's version.
        builtin: Whether accelreg itself provides it.
        replaces: Provider of the built-in this backend replaced, if any.
        visible_devices_var: The masking variable, or ``None``.
        visible_devices: Physical ids behind logical indices 0..n-1 when the variable is set,
            else ``None`` (all devices visible).
        indexed: Whether devices carry an index.
        plugin: The entry-point (or registration) name of the plugin that yielded it.
    """

    name: str
    device_type: str
    priority: int
    position: int
    available: bool
    reason: str
    device_count: int
    provider: str
    provider_version: str
    builtin: bool
    replaces: str | None = None
    visible_devices_var: str | None = None
    visible_devices: tuple[str, ...] | None = None
    indexed: bool = True
    plugin: str = ""

    def devices(self) -> tuple[str, ...]:
        """Fully qualified device strings this backend offers here, in index order."""
        if not self.available:
            return ()
        if not self.indexed:
            return (self.device_type,) if self.device_count else ()
        return tuple(f"{self.device_type}:{i}" for i in range(self.device_count))


@dataclass(frozen=True)
class DtypeSupport:
    """Whether one device computes in one dtype, and why accelreg says so.

    Attributes:
        dtype: torch's name of the dtype (``"bfloat16"``).
        supported: ``True``, ``False``, or ``None``: *unknown* (neither the backend's plugin
            nor its runtime says). Never read ``None`` as ``False``.
        source: Who answered: ``"declared"`` (the plugin's ``BackendSpec.dtypes`` mapping),
            ``"probe"`` (its ``dtypes`` probe), ``"runtime"`` (``torch.<device_type>``'s own
            answer), or ``"unknown"``.
        reason: The answer in words, e.g. ``"torch.npu.is_bf16_supported() answered True"``.
    """

    dtype: str
    supported: bool | None
    source: str
    reason: str

    @property
    def known(self) -> bool:
        """Whether anyone answered (``supported`` is ``True`` or ``False``)."""
        return self.supported is not None


@dataclass(frozen=True)
class Capabilities:
    """What one device computes in, as :func:`accelreg.capabilities` answers it.

    Attributes:
        backend: The backend whose device it is (``"npu"``).
        device: The device, fully qualified (``"npu:0"``, ``"hpu"``, ``"cpu"``).
        dtypes: One :class:`DtypeSupport` for each of :data:`accelreg.dtypes.COMPUTE_DTYPES`
            (bfloat16, float16, float8_e4m3fn, float8_e5m2), in that order, then one for each
            other dtype the plugin declares.
    """

    backend: str
    device: str
    dtypes: tuple[DtypeSupport, ...]

    def support(self, dtype: Any) -> DtypeSupport:
        """The answer for ``dtype`` (a ``torch.dtype``, or its name: ``"bfloat16"``, also
        ``"bf16"``/``"fp16"``). A dtype the query has no answer for (not one of the four above
        and not declared by the plugin) raises :class:`~accelreg.errors.DeviceError` naming
        those it has; a wrong type raises ``TypeError``."""
        try:
            name = dtype_name(dtype)
        except ValueError as exc:
            raise DeviceError(str(exc)) from None
        for item in self.dtypes:
            if item.dtype == name:
                return item
        known = ", ".join(item.dtype for item in self.dtypes)
        raise DeviceError(
            f"capabilities answer for {known} on {self.device}, not {name!r} (a plugin may declare "
            "more in BackendSpec.dtypes)"
        )

    def supports(self, dtype: Any) -> bool | None:
        """``True``, ``False``, or ``None`` when unknown (see :meth:`support`)."""
        return self.support(dtype).supported

    def as_dict(self) -> dict[str, Any]:
        """Plain data: ``{"device": ..., "dtypes": {name: {"supported", "source", "reason"}}}``."""
        return {
            "device": self.device,
            "dtypes": {
                d.dtype: {"supported": d.supported, "source": d.source, "reason": d.reason}
                for d in self.dtypes
            },
        }


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that failed to load or to answer, as ``accelreg env`` reports it.

    Attributes:
        plugin: Entry-point (or registration) name.
        distribution: Distribution that ships it, if known.
        version: Its version, if known.
        stage: What failed: ``"import"``, ``"accelreg_backends"``, ``"probe is_available"``, ...
        error: The exception, formatted as ``Type: message``.
    """

    plugin: str
    distribution: str
    version: str
    stage: str
    error: str

    def __str__(self) -> str:
        who = self.plugin
        if self.distribution:
            who += f" (from {self.distribution} {self.version})".rstrip()
        return f"{who}: {self.stage} failed: {self.error}"


@dataclass(frozen=True)
class PlacementRule:
    """Where one kind of quantized parameter may live and which state-dict keys travel with it.

    Yielded by ``accelreg_placement_rules(backend)``; ``accelreg.placement_rule(backend,
    quant_method)`` returns the one that applies.

    Attributes:
        backend: Backend the rule is for (``"*"`` for every backend).
        quant_method: Quantization method name (``"bnb_8bit"``, ``"bnb_4bit"``).
        module_classes: Qualified class names of the modules that hold such parameters
            (``"bitsandbytes.nn.modules.Linear8bitLt"``).
        param: Name of the quantized parameter within the module (``"weight"``).
        travelling_keys: State-dict key suffixes (relative to the module prefix) that belong to
            the quantized parameter and must reach the module's loader together, on the target
            device (``("weight", "SCB", "weight_format")``). A suffix ending in ``"."`` matches
            every key that starts with it.
        dropped_keys: Suffixes that must never reach the module's own loader.
        offload: Non-accelerator places the parameter may live on this backend
            (a subset of ``{"cpu", "disk"}``); empty means accelerator only.
        bits_per_element: Storage bits per weight element (8 for int8, 4 for packed 4-bit).
        bytes_per_row: Extra bytes per output row (8-bit SCB: 4).
        block_size: Elements per quantization block (0 when not block-wise).
        bytes_per_block: Extra bytes per block (4-bit absmax).
        fixed_bytes: Extra bytes per parameter (4-bit quant map, state tensors).
        provider: Distribution that supplied the rule.
        before_load: Optional ``(module, state_dict, prefix, device, event) -> None`` run by
            the load hook after the travelling keys were moved to ``device`` and before the
            module's own loader: the quantization library's chance to make its state reachable
            where its loader looks, consume keys the loader must not see, and refuse formats
            it cannot load (raise :class:`~accelreg.errors.PlacementError`). ``event`` is a dict
            for notes that end up in the load report.
        after_load: Optional ``(module, event) -> None`` run after the module's loader, to
            restore the module's own layout.
        unsupported: Non-empty when the quantization library cannot put such parameters on
            this backend's devices; it says why. :func:`accelreg.placement_rule` raises
            :class:`~accelreg.errors.PlacementError` with it, so planning or checking a map
            refuses the placement before the library fails inside. The load hooks still use
            the rule for a layer that already lives there.
    """

    backend: str
    quant_method: str
    module_classes: tuple[str, ...]
    param: str = "weight"
    travelling_keys: tuple[str, ...] = ("weight",)
    dropped_keys: tuple[str, ...] = ()
    offload: frozenset[str] = field(default_factory=frozenset)
    bits_per_element: float = 8.0
    bytes_per_row: int = 0
    block_size: int = 0
    bytes_per_block: int = 0
    fixed_bytes: int = 0
    provider: str = ""
    before_load: Callable[..., None] | None = None
    after_load: Callable[..., None] | None = None
    unsupported: str = ""

    def may_live_on(self, device: str) -> bool:
        """Whether a parameter under this rule may be placed on ``device`` (``"npu:0"``,
        ``"cpu"``, ``"disk"``)."""
        kind = device.split(":", 1)[0]
        if kind in ("cpu", "disk"):
            return kind in self.offload
        return True

    def quantized_nbytes(self, shape: Sequence[int]) -> int:
        """Bytes the quantized parameter of this ``shape`` occupies (weight plus its state)."""
        numel = math.prod(shape)
        rows = shape[0] if len(shape) else 1
        nbytes = math.ceil(numel * self.bits_per_element / 8) + rows * self.bytes_per_row
        if self.block_size:
            nbytes += math.ceil(numel / self.block_size) * self.bytes_per_block
        return nbytes + self.fixed_bytes
