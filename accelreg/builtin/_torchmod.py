"""A backend whose runtime is a torch device module (``torch.npu``, ``torch.xpu``, ...).

Most accelerators plug into torch the same way: an optional vendor package that, once
imported, installs ``torch.<name>`` with ``is_available``/``device_count``/``current_device``
and usually ``mem_get_info`` and ``get_device_name``. :func:`torch_module_backend` builds the
probes for that shape so each built-in backend file only states its facts.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ..plugin import Availability, BackendSpec, HardwareSignature, MemoryInfo, parse_visible_devices

__all__ = ["device_module", "package_missing", "read_first_line", "torch_module_backend"]


def package_missing(package: str) -> bool:
    """Whether ``package`` (possibly dotted) cannot be found, without importing it."""
    parts = package.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(name) is None:
                return True
        except (ImportError, ValueError):
            return True
    return False


def device_module(attr: str, package: str | None) -> Any:
    """``torch.<attr>`` after importing ``package``; raises if either is missing."""
    import torch

    if package is not None:
        importlib.import_module(package)
    module = getattr(torch, attr, None)
    if module is None:
        raise RuntimeError(f"torch.{attr} does not exist")
    return module


def _available(
    attr: str, package: str | None, not_compiled: Callable[[Any], str | None] | None
) -> Availability:
    if package is not None and package_missing(package):
        return Availability.no(f"{package} is not installed")
    try:
        module = device_module(attr, package)
    except Exception as exc:  # noqa: BLE001 - a broken vendor package is a reason, not a crash
        what = f"importing {package}" if package else f"torch.{attr}"
        return Availability.no(f"{what} failed: {type(exc).__name__}: {exc}")
    if not_compiled is not None:
        reason = not_compiled(module)
        if reason:
            return Availability.no(reason)
    if not module.is_available():
        return Availability.no(f"torch.{attr} reports no devices")
    count = module.device_count()
    version = _version(package) if package else ""
    via = f" via {package} {version}".rstrip() if package else f" via torch.{attr}"
    return Availability.yes(f"{count} device(s){via}")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    top = package.split(".")[0]
    try:
        return version(top.replace("_", "-"))
    except PackageNotFoundError:
        try:
            return version(top)
        except PackageNotFoundError:
            return ""


def _count(attr: str, package: str | None) -> int:
    return int(device_module(attr, package).device_count())


def _current(attr: str, package: str | None) -> int:
    return int(device_module(attr, package).current_device())


def _memory(attr: str, package: str | None, index: int) -> MemoryInfo | None:
    module = device_module(attr, package)
    if hasattr(module, "mem_get_info"):
        free, total = module.mem_get_info(index)
        return MemoryInfo(free=int(free), total=int(total))
    if hasattr(module, "get_device_properties"):
        total = int(module.get_device_properties(index).total_memory)
        used = int(module.memory_reserved(index)) if hasattr(module, "memory_reserved") else 0
        return MemoryInfo(free=max(total - used, 0), total=total)
    return None


def _device_name(attr: str, package: str | None, index: int) -> str:
    module = device_module(attr, package)
    if hasattr(module, "get_device_name"):
        return str(module.get_device_name(index))
    return str(module.get_device_properties(index).name)


def _versions(package: str | None, runtime: Callable[[], Mapping[str, str]] | None) -> dict[str, str]:
    """The vendor package's version (from its metadata: nothing is imported), then what
    ``runtime`` adds (the runtime's own and the driver's, where the backend can say)."""
    out: dict[str, str] = {}
    if package is not None and not package_missing(package.split(".")[0]):
        version = _version(package)
        if version:
            out[package.split(".")[0]] = version
    if runtime is not None:
        out.update(runtime())
    return out


def read_first_line(path: str) -> str | None:
    """The first line of a small text file (a driver's version file), or ``None``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline(4096).strip() or None
    except OSError:
        return None


def torch_module_backend(
    name: str,
    *,
    priority: int,
    package: str | None,
    visible_devices_var: str | None,
    description: str,
    attr: str | None = None,
    not_compiled: Callable[[Any], str | None] | None = None,
    parse_visible: Callable[[str], Sequence[str]] | None = None,
    device: Callable[[int], Any] | None = None,
    indexed: bool = True,
    dist_backend: str | None = None,
    presence: Callable[[], str | None] | None = None,
    runtime_versions: Callable[[], Mapping[str, str]] | None = None,
    ray_resource: str | None = None,
    gres: tuple[str, ...] | None = None,
    hardware: HardwareSignature | None = None,
    vllm_platform: str | tuple[str, ...] | None = None,
    dtypes: Callable[[int], Mapping[str, Any]] | None = None,
) -> BackendSpec:
    """A :class:`BackendSpec` for a runtime exposed as ``torch.<attr>`` by ``package``.

    ``versions`` reports ``package``'s version (from its metadata) and what
    ``runtime_versions`` adds; ``device_name`` asks ``torch.<attr>.get_device_name``. Without
    ``dtypes`` the registry asks ``torch.<attr>`` itself what its devices compute in
    (``is_bf16_supported()``, ``get_amp_supported_dtype()``), as it asks any vendor's runtime."""
    attr = attr or name
    if parse_visible is None and visible_devices_var is not None:
        parse_visible = partial(parse_visible_devices, var=visible_devices_var)
    return BackendSpec(
        name=name,
        priority=priority,
        is_available=partial(_available, attr, package, not_compiled),
        device_count=partial(_count, attr, package),
        current_index=partial(_current, attr, package),
        memory_info=partial(_memory, attr, package),
        visible_devices_var=visible_devices_var,
        parse_visible_devices=parse_visible,
        device=device,
        indexed=indexed,
        description=description,
        runtime_package=package,
        dist_backend=dist_backend,
        presence=presence,
        versions=partial(_versions, package, runtime_versions),
        device_name=partial(_device_name, attr, package),
        ray_resource=ray_resource,
        gres=gres,
        hardware=hardware,
        vllm_platform=vllm_platform,
        dtypes=dtypes,
    )
