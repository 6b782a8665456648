"""The registry's own validated copies of the records plugins yield.

A plugin hands accelreg :class:`~accelreg.types.BackendSpec` and
:class:`~accelreg.types.PlacementRule` records; the registry keeps a checked copy of each
(:func:`own_spec`, :func:`own_rule`), so a plugin that answers nonsense fails alone, in words, and
a plugin that changes its record afterwards (or a ``str`` subclass that answers differently
later) cannot change what accelreg decided.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._text import short
from ..config import NAME_RE
from ..dtypes import dtype_name
from ..types import BackendSpec, HardwareSignature, PlacementRule
from .containment import CONTAINED, Nonsense, describe, safe_repr

if TYPE_CHECKING:
    from .loading import Plugin

__all__ = ["RAY_RESERVED", "RESERVED", "Checked", "check_dtypes", "own_rule", "own_spec"]

#: Names a backend may not take: they mean something else in a device map.
RESERVED = frozenset({"auto", "disk", "meta", "balanced", "balanced_low_0", "sequential"})
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_RAY_RESOURCE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: Ray's own resources that are not accelerators: a backend cannot be offered under these names.
RAY_RESERVED = frozenset({"CPU", "memory", "object_store_memory"})
#: A Slurm GRES name (``gpu``, ``npu``, ``mlu``): what ``Gres=`` in ``slurm.conf`` may declare.
_GRES = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_MAX_GRES = 8
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,7}")
_OPTIONAL_CALLABLES = (
    "current_index",
    "device",
    "memory_info",
    "parse_visible_devices",
    "presence",
    "versions",
    "device_name",
)


def own_spec(spec: Any, plugin: Plugin) -> BackendSpec:
    """A validated copy of ``spec`` that the plugin cannot change afterwards.

    Every field of :class:`BackendSpec` is copied (fields added later included); strings and
    ints are copied as exact ``str``/``int``, so a subclass cannot answer differently later.
    Raises :class:`Nonsense` naming the first problem.
    """
    try:
        return _own_spec(spec, plugin)
    except Nonsense:
        raise
    except CONTAINED as exc:
        raise Nonsense(f"yielded an unusable BackendSpec: {describe(exc)}") from None


def _own_spec(spec: Any, plugin: Plugin) -> BackendSpec:
    if not isinstance(spec, BackendSpec):
        raise Nonsense(f"yielded {safe_repr(spec)}, not a BackendSpec")
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(BackendSpec)}
    name = values["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise Nonsense(f"backend name {safe_repr(name)} is not lower case [a-z0-9_], starting with a letter")
    name = values["name"] = str.__str__(name)
    if name in RESERVED:
        raise Nonsense(f"backend name {name!r} is reserved")
    if name == "cpu" and not plugin.builtin:
        raise Nonsense("the cpu backend is accelreg's own; a plugin cannot replace it")
    priority = values["priority"]
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise Nonsense(f"priority of {name!r} must be an int, got {safe_repr(priority)}")
    values["priority"] = operator.index(priority)
    for field_name, pattern, what in (
        ("device_type", NAME_RE, "a valid torch device type"),
        ("visible_devices_var", _ENV_VAR, "an environment variable name"),
        ("runtime_package", _PACKAGE, "an importable package name"),
        ("dist_backend", NAME_RE, "a torch.distributed backend name"),
        ("ray_resource", _RAY_RESOURCE, "a Ray resource name (letters, digits and _)"),
    ):
        if field_name not in values:
            continue  # a field of a later accelreg (dist_backend) on this version
        value = values[field_name]
        if value is None:
            continue
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise Nonsense(f"{field_name} {safe_repr(value)} of {name!r} is not {what}")
        values[field_name] = str.__str__(value)
    if "vllm_platform" in values:
        values["vllm_platform"] = _vllm_platforms(values["vllm_platform"], name)
    if values.get("ray_resource") in RAY_RESERVED:
        raise Nonsense(f"ray_resource {values['ray_resource']!r} of {name!r} is one of Ray's own resources")
    if "gres" in values:  # a field of a later accelreg on this version
        values["gres"] = _gres(values["gres"], name)
    for field_name in ("is_available", "device_count"):
        if not callable(values[field_name]):
            raise Nonsense(f"{field_name} of {name!r} is not callable")
    for field_name in _OPTIONAL_CALLABLES:
        if field_name in values and values[field_name] is not None and not callable(values[field_name]):
            raise Nonsense(f"{field_name} of {name!r} is not callable")
    if values.get("hardware") is not None:
        values["hardware"] = _own_hardware(values["hardware"], name)
    if "dtypes" in values:  # a field of a later accelreg on this version
        values["dtypes"] = _own_dtypes(values["dtypes"], name)
    if not isinstance(values["indexed"], bool):
        raise Nonsense(f"indexed of {name!r} must be True or False, got {safe_repr(values['indexed'])}")
    if not isinstance(values["description"], str):
        raise Nonsense(f"description of {name!r} must be a string")
    values["description"] = str.__str__(values["description"])[:200]
    return BackendSpec(**values)


def _gres(value: Any, name: str) -> tuple[str, ...] | None:
    """``gres``: ``None``, or a tuple/list of at most 8 distinct Slurm GRES names."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_GRES:
        raise Nonsense(
            f"gres {safe_repr(value)} of {name!r} is not a tuple of at most {_MAX_GRES} GRES names"
        )
    names: list[str] = []
    for item in value:
        if not isinstance(item, str) or not _GRES.fullmatch(item):
            raise Nonsense(
                f"gres {safe_repr(item)} of {name!r} is not a Slurm GRES name (letters, digits and _)"
            )
        item = str.__str__(item)
        if item in names:
            raise Nonsense(f"gres of {name!r} names {item!r} twice")
        names.append(item)
    return tuple(names)


# -- dtypes ---------------------------------------------------------------------------------
_MAX_ENTRIES, _MAX_REASON = 32, 200
#: A checked answer: ``{name: (True | False | None, reason or None)}``.
Checked = dict[str, "tuple[bool | None, str | None]"]


def check_dtypes(value: Any) -> Checked:
    """The registry's copy of a ``dtypes`` mapping, or :class:`Nonsense` naming the problem."""
    if not isinstance(value, Mapping):
        raise Nonsense(f"dtypes returned {safe_repr(value)}, not a mapping of dtype names to True/False/None")
    items = list(value.items())
    if len(items) > _MAX_ENTRIES:
        raise Nonsense(f"dtypes has {len(items)} entries; at most {_MAX_ENTRIES}")
    out: Checked = {}
    for key, answer in items:
        try:
            name = dtype_name(key)
        except (TypeError, ValueError) as exc:
            raise Nonsense(f"dtypes names {safe_repr(key)}: {exc}") from None
        if name in out:
            raise Nonsense(f"dtypes names {name} twice")
        out[name] = _check_answer(name, answer)
    return out


def _check_answer(name: str, answer: Any) -> tuple[bool | None, str | None]:
    reason = None
    if isinstance(answer, tuple) and tuple.__len__(answer) == 2:
        answer, reason = tuple.__getitem__(answer, 0), tuple.__getitem__(answer, 1)
        if not isinstance(reason, str) or not reason.strip():
            raise Nonsense(f"dtypes[{name!r}] gives the reason {safe_repr(reason)}, not a non-empty str")
        reason = " ".join(str.__str__(reason).split())[:_MAX_REASON]
    if answer is not None and not isinstance(answer, bool):
        raise Nonsense(f"dtypes[{name!r}] is {safe_repr(answer)}, not True, False or None")
    return (None if answer is None else bool(answer)), reason


def _own_dtypes(value: Any, name: str) -> Checked | Any:
    """``dtypes``: ``None``, a probe (callable), or a mapping, checked and copied now."""
    if value is None or callable(value):
        return value
    if not isinstance(value, Mapping):
        raise Nonsense(f"dtypes of {name!r} is {safe_repr(value)}, neither a mapping nor a probe (callable)")
    try:
        return check_dtypes(value)
    except Nonsense as exc:
        raise Nonsense(f"dtypes of {name!r}: {exc}") from None


# -- hardware signatures ------------------------------------------------------------------
_PCI_VENDOR = re.compile(r"0x[0-9a-fA-F]{4}")
_PCI_CLASS = re.compile(r"0x(?:[0-9a-fA-F]{2}){1,3}")
#: At most this many patterns of each kind, each at most 200 characters: a signature is a few
#: cheap looks, never a scan.
_MAX_PATTERNS = 16


def _own_hardware(value: Any, name: str) -> HardwareSignature:
    """A checked copy of ``BackendSpec.hardware``: absolute paths without ``..`` (looked up under
    the root only), PCI ids in ``0x`` hex (lower-cased), short text, and something to look for."""
    if not isinstance(value, HardwareSignature):
        raise Nonsense(f"hardware of {name!r} is {safe_repr(value)}, not a HardwareSignature")
    fields: dict[str, Any] = {}
    for field_name, limit in (("what", 100), ("install", 200)):
        text = getattr(value, field_name)
        if not isinstance(text, str) or len(text) > limit or (field_name == "what" and not text.strip()):
            raise Nonsense(
                f"hardware.{field_name} of {name!r} must be a string of at most {limit} characters"
            )
        fields[field_name] = " ".join(str.__str__(text).split())
    for field_name, check in (
        ("device_nodes", _absolute),
        ("files", _absolute),
        ("pci_vendors", _PCI_VENDOR.fullmatch),
        ("pci_classes", _PCI_CLASS.fullmatch),
    ):
        items = getattr(value, field_name)
        if (
            not isinstance(items, (tuple, list))
            or len(items) > _MAX_PATTERNS
            or not all(isinstance(i, str) and len(i) <= 200 and check(i) for i in items)
        ):
            raise Nonsense(f"hardware.{field_name} of {name!r} is not a tuple of {_WHAT[field_name]}")
        fields[field_name] = tuple(
            str.__str__(i).lower() if "pci" in field_name else str.__str__(i) for i in items
        )
    if not (fields["device_nodes"] or fields["files"] or fields["pci_vendors"]):
        raise Nonsense(f"hardware of {name!r} names nothing to look for (device_nodes, files or pci_vendors)")
    if fields["pci_classes"] and not fields["pci_vendors"]:
        raise Nonsense(f"hardware.pci_classes of {name!r} narrows pci_vendors, which is empty")
    return HardwareSignature(**fields)


def _absolute(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/") and "\0" not in path


_WHAT = {
    "device_nodes": "absolute paths or glob patterns (no '..')",
    "files": "absolute paths or glob patterns (no '..')",
    "pci_vendors": "PCI vendor ids such as '0x19e5'",
    "pci_classes": "PCI class prefixes such as '0x12' or '0x0302'",
}


#: A vLLM platform's name (an entry-point name or one of vLLM's own) or a class path.
_VLLM_PLATFORM = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){1,15}"
)


def _vllm_platforms(value: Any, name: str) -> tuple[str, ...] | None:
    """``vllm_platform`` as the registry keeps it: ``None``, or a tuple of 1-8 names."""
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (tuple, list)) or not 1 <= len(names) <= 8:
        raise Nonsense(
            f"vllm_platform of {name!r} must be a name or a tuple of 1-8 names, got {safe_repr(value)}"
        )
    for item in names:
        if not isinstance(item, str) or not _VLLM_PLATFORM.fullmatch(item):
            raise Nonsense(
                f"vllm_platform {safe_repr(item)} of {name!r} is not a vLLM platform name or a platform class path"
            )
    return tuple(str.__str__(item) for item in names)


# -- placement rules ----------------------------------------------------------------------
_BACKEND = re.compile(r"\*|[a-z][a-z0-9_]{0,63}")
_METHOD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_COUNTS = ("bytes_per_row", "block_size", "bytes_per_block", "fixed_bytes")
_KEY_TUPLES = ("travelling_keys", "dropped_keys")


def own_rule(rule: Any) -> PlacementRule:
    """A validated copy of a rule a plugin yielded, which the plugin cannot change afterwards.

    Every field is copied (fields added later included); the ones the planner and the load
    hooks compute with are checked: a backend name or ``"*"``, a quantization method name,
    qualified class names, parameter and state-dict key names, ``offload`` within
    ``{"cpu", "disk"}``, ``0 < bits_per_element <= 64``, non-negative integer byte counts and
    callables. Raises ``ValueError`` naming the first problem.
    """
    if not isinstance(rule, PlacementRule):
        raise ValueError(f"{type(rule).__name__} is not a PlacementRule")
    values = {f.name: getattr(rule, f.name) for f in dataclasses.fields(PlacementRule)}
    for name, pattern in (("backend", _BACKEND), ("quant_method", _METHOD), ("param", _KEY)):
        value = values[name]
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"{name} must be a name, got {short(value)}")
        values[name] = str.__str__(value)
    for name, pattern in (("module_classes", _CLASS), *((k, _KEY) for k in _KEY_TUPLES)):
        values[name] = _names(name, values[name], pattern, empty_ok=name != "module_classes")
    offload = values["offload"]
    if not isinstance(offload, (set, frozenset)) or not all(isinstance(o, str) for o in offload):
        raise ValueError(f"offload must be a set of 'cpu'/'disk', got {short(offload)}")
    offload = frozenset(str.__str__(o) for o in offload)
    if not offload <= {"cpu", "disk"}:
        raise ValueError(f"offload may name only 'cpu' and 'disk', got {sorted(offload)}")
    values["offload"] = offload
    bits = values["bits_per_element"]
    if isinstance(bits, bool) or not isinstance(bits, (int, float)):
        raise ValueError(f"bits_per_element must be a number, got {short(bits)}")
    bits = operator.index(bits) if isinstance(bits, int) else float.__float__(bits)
    if not (math.isfinite(bits) and 0 < bits <= 64):
        raise ValueError(f"bits_per_element must be in (0, 64], got {bits!r}")
    values["bits_per_element"] = bits
    for name in _COUNTS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or operator.index(value) < 0:
            raise ValueError(f"{name} must be a non-negative int, got {short(value)}")
        values[name] = operator.index(value)
    for name in ("provider", "unsupported"):
        if not isinstance(values[name], str):
            raise ValueError(f"{name} must be a string, got {short(values[name])}")
        values[name] = str.__str__(values[name])
    for name in ("before_load", "after_load"):
        if values[name] is not None and not callable(values[name]):
            raise ValueError(f"{name} must be callable or None")
    return PlacementRule(**values)


def _names(field: str, value: Any, pattern: re.Pattern[str], *, empty_ok: bool) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(v, str) and pattern.fullmatch(v) for v in value
    ):
        raise ValueError(f"{field} must be a tuple of names, got {short(value)}")
    if not value and not empty_ok:
        raise ValueError(f"{field} is empty: the rule would govern no module")
    return tuple(str.__str__(v) for v in value)
