"""Backend plugins defined in tests: real pluggy plugins with scripted probes.

Device types must be ones torch knows without a vendor runtime (cuda, xpu, hpu, mtia, ve,
ipu, fpga, maia), since resolve() builds real ``torch.device`` objects.
"""

from __future__ import annotations

import textwrap
import types
from pathlib import Path
from typing import Any

import accelreg
from accelreg.types import Availability, BackendSpec, MemoryInfo


def spec(
    name: str,
    count: int = 2,
    *,
    priority: int = 50,
    device_type: str | None = None,
    available: Any = True,
    current: int = 0,
    var: str | None = None,
    **extra: Any,
) -> BackendSpec:
    def is_available():
        if callable(available):
            return available()
        return available if not isinstance(available, bool) else Availability(available, "scripted")

    return BackendSpec(
        name=name,
        priority=priority,
        device_type=device_type,
        is_available=is_available,
        device_count=lambda: count,
        current_index=lambda: current,
        visible_devices_var=var,
        memory_info=lambda i: MemoryInfo(free=(i + 1) << 30, total=(i + 2) << 30),
        **extra,
    )


def plugin(*specs: BackendSpec, rules: Any = None) -> Any:
    """A plugin object (a namespace with hookimpls) yielding ``specs``."""
    ns = types.SimpleNamespace()

    @accelreg.hookimpl
    def accelreg_backends():
        return list(specs)

    ns.accelreg_backends = accelreg_backends
    if rules is not None:

        @accelreg.hookimpl
        def accelreg_placement_rules(backend):
            return rules(backend)

        ns.accelreg_placement_rules = accelreg_placement_rules
    return ns


def make_dist(root: Path, dist: str, version: str, module: str, source: str, ep_name: str) -> Path:
    """A fake installed distribution: ``<dist>-<version>.dist-info`` plus its plugin module."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[accelreg]\n{ep_name} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


class LyingInt(int):
    """An int whose ``__int__`` lies and whose comparisons raise: Python and torch use its value
    (``operator.index``), and so must accelreg."""

    def __int__(self) -> int:
        return 0

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("comparison raises")

    __le__ = __gt__ = __ge__ = __lt__
