"""Fault injection: broken, hanging, lying, duplicate or vanished plugins and broken config files.

For every fault the registry keeps answering for the healthy backend (a scripted ``xpu`` with
two devices), the fault is recorded, and strict mode turns it into an error.
``python tests/test_faults.py`` prints the table for docs/reliability.md.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import accelreg
from accelreg import AccelregError, ConfigError, PluginError

try:
    from ._fakes import make_dist, plugin, spec
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests._fakes import make_dist, plugin, spec

HEALTHY = torch.device("xpu", 1)
CALLABLES = (
    "is_available",
    "device_count",
    "current_index",
    "device",
    "memory_info",
    "parse_visible_devices",
)


def _boom(*args: Any) -> Any:
    raise OSError("driver exploded")


def _hang(*args: Any) -> Any:
    time.sleep(30)


@dataclass(frozen=True)
class Fault:
    name: str
    setup: Callable[[Any, Path], None]
    query: str = "resolve(1, backend='xpu')"  # what a healthy caller does meanwhile


def _register(*specs: Any, rules: Any = None) -> None:
    accelreg.register(plugin(*specs, rules=rules), "fakeplugin_fault")
    accelreg.register(plugin(spec("xpu", 2, priority=90)), "fakeplugin_healthy")


def _with(field: str, impl: Callable[..., Any]) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        import dataclasses

        base = spec("cuda", 2, priority=100, var="CUDA_VISIBLE_DEVICES")
        if field == "is_available":
            broken = dataclasses.replace(base, is_available=impl)
        else:
            broken = dataclasses.replace(base, **{field: impl})
        if field == "parse_visible_devices":
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        _register(broken)

    return setup


def _nonsense(field: str, value: Any) -> Callable[[Any, Path], None]:
    return _with(field, lambda *a: value)


def _import_error(monkeypatch: Any, tmp: Path) -> None:
    root = make_dist(
        tmp / "d1",
        "broken-accel",
        "2.0",
        "fakeplugin_importerr",
        "raise ImportError('libacme.so missing')",
        "acme",
    )
    monkeypatch.syspath_prepend(str(root))
    _register()


def _hang_on_import(monkeypatch: Any, tmp: Path) -> None:
    root = make_dist(
        tmp / "d2", "slow-accel", "2.0", "fakeplugin_importhang", "import time\ntime.sleep(30)", "slow"
    )
    monkeypatch.syspath_prepend(str(root))
    _register()


def _duplicate(monkeypatch: Any, tmp: Path) -> None:
    source = (
        "import accelreg\nfrom accelreg.types import BackendSpec\n"
        "@accelreg.hookimpl\ndef accelreg_backends():\n"
        "    yield BackendSpec(name='cuda', priority=100, is_available=lambda: True, device_count=lambda: 1)\n"
    )
    for i in (1, 2):
        root = make_dist(tmp / f"dup{i}", f"vendor-{i}", "1.0", f"fakeplugin_dup{i}", source, "cuda")
        monkeypatch.syspath_prepend(str(root))
    _register()


def _removed(monkeypatch: Any, tmp: Path) -> None:
    source = (
        "import accelreg\nfrom accelreg.types import BackendSpec\n"
        "@accelreg.hookimpl\ndef accelreg_backends():\n"
        "    yield BackendSpec(name='acme', priority=100, device_type='ve', is_available=lambda: True, device_count=lambda: 1)\n"
    )
    root = make_dist(tmp / "gone", "gone-accel", "1.0", "fakeplugin_gone", source, "acme")
    monkeypatch.syspath_prepend(str(root))
    accelreg.reset()
    assert accelreg.resolve() == torch.device("ve", 0)  # present in the first run
    shutil.rmtree(root)  # uninstalled between runs
    sys.modules.pop("fakeplugin_gone", None)
    import importlib

    importlib.invalidate_caches()
    _register()


def _hook_raises(monkeypatch: Any, tmp: Path) -> None:
    class Bad:
        @accelreg.hookimpl
        def accelreg_backends(self):
            raise RuntimeError("cannot enumerate")

    accelreg.register(Bad(), "fakeplugin_hookraise")
    accelreg.register(plugin(spec("xpu", 2, priority=90)), "fakeplugin_healthy")


def _rules_raise(monkeypatch: Any, tmp: Path) -> None:
    _register(rules=lambda backend: _boom())


def _config(content: bytes | str) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        path = tmp / "work" / "accelreg.toml"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        _register()

    return setup


def _unreadable(monkeypatch: Any, tmp: Path) -> None:
    monkeypatch.setenv("ACCELREG_CONFIG", str(tmp / "nowhere" / "config.toml"))
    (tmp / "work" / "accelreg.toml").mkdir()  # a folder where the file should be
    _register()


FAULTS = [
    *(Fault(f"{f} raises", _with(f, _boom)) for f in CALLABLES),
    *(Fault(f"{f} hangs", _with(f, _hang)) for f in CALLABLES),
    Fault("is_available returns a string", _nonsense("is_available", "yes")),
    Fault("device_count returns -1", _nonsense("device_count", -1)),
    Fault("device_count returns 2.5", _nonsense("device_count", 2.5)),
    Fault("device_count returns True", _nonsense("device_count", True)),
    Fault("current_index returns 7", _nonsense("current_index", 7)),
    Fault("device returns a cpu device", _nonsense("device", torch.device("cpu"))),
    Fault("memory_info returns free > total", _nonsense("memory_info", accelreg.MemoryInfo(free=5, total=1))),
    Fault("parse_visible_devices returns ints", _nonsense("parse_visible_devices", (0, 1))),
    Fault("plugin fails to import", _import_error),
    Fault("plugin import hangs", _hang_on_import),
    Fault("accelreg_backends raises", _hook_raises),
    Fault("accelreg_placement_rules raises", _rules_raise),
    Fault("two plugins register one name", _duplicate),
    Fault("plugin removed between runs", _removed),
    Fault("config file malformed", _config("priority = [\n")),
    Fault("config file not UTF-8", _config(b"\xff\xfe\x00")),
    Fault("config file huge (2 MiB)", _config("#" + "x" * (2 << 20))),
    Fault("config file unreadable", _unreadable),
]


def _exercise(fault: Fault) -> str:
    """Run the healthy caller's queries; returns what the faulty backend looked like."""
    assert accelreg.resolve(1, backend="xpu") == HEALTHY
    infos = {b.name: b for b in accelreg.backends()}
    assert infos["xpu"].available and infos["xpu"].device_count == 2
    from accelreg import registry

    outcomes = []
    for query in (
        lambda: accelreg.resolve("cuda"),
        lambda: accelreg.resolve(0, backend="cuda"),
        lambda: registry.get().backend("cuda").memory(0),
        lambda: registry.get().rules("xpu"),
    ):
        try:
            query()
        except (AccelregError, TypeError) as exc:
            outcomes.append(type(exc).__name__)
    return ", ".join(sorted(set(outcomes))) or "ok"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_registry_keeps_answering_and_records_the_fault(fault, monkeypatch, tmp_path):
    accelreg.configure(probe_timeout=1.0)  # roomy: a loaded machine must not time out healthy probes
    fault.setup(monkeypatch, tmp_path)
    accelreg.configure(probe_timeout=1.0)
    start = time.perf_counter()
    _exercise(fault)
    assert time.perf_counter() - start < 10, "a hanging plugin held up the healthy caller"
    from accelreg import registry

    snap = registry.get()
    recorded = snap.failures or snap.warnings or snap.conflicts or snap.settings.errors
    if fault.name == "plugin removed between runs":
        assert "acme" not in snap.by_name  # gone cleanly: nothing stale is left to record
    else:
        assert recorded, f"{fault.name}: nothing was recorded"


@pytest.mark.parametrize(
    "fault", [f for f in FAULTS if f.name != "plugin removed between runs"], ids=lambda f: f.name
)
def test_strict_mode_turns_the_fault_into_an_error(fault, monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    monkeypatch.setenv("ACCELREG_PROBE_TIMEOUT", "0.3")
    from accelreg import registry

    raised: list[BaseException] = []
    try:
        fault.setup(monkeypatch, tmp_path)  # strict: an import failure raises while building
        queries = [
            lambda: accelreg.resolve(1, backend="xpu"),
            accelreg.backends,
            lambda: accelreg.resolve("cuda"),
            lambda: registry.get().backend("cuda").memory(0),
            lambda: registry.get().rules("xpu"),
        ]
    except (PluginError, ConfigError) as exc:
        raised.append(exc)
        queries = []
    for query in queries:
        try:
            query()
        except (PluginError, ConfigError) as exc:
            raised.append(exc)
        except accelreg.DeviceError:
            pass  # an unavailable backend, the non-strict consequence
    assert raised, f"strict mode let {fault.name!r} pass silently"


def _row(fault: Fault, strict: bool) -> tuple[str, str, str]:
    import tempfile

    from accelreg import registry

    accelreg.reset()
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        Path(tmp, "work").mkdir()
        mp.chdir(Path(tmp, "work"))
        mp.setenv("XDG_CONFIG_HOME", str(Path(tmp, "xdg")))
        mp.setenv("ACCELREG_PROBE_TIMEOUT", "0.3")
        if strict:
            mp.setenv("ACCELREG_STRICT", "1")
        try:
            fault.setup(mp, Path(tmp))
            outcome = _exercise(fault)
        except (AccelregError, TypeError) as exc:
            return "-", type(exc).__name__, str(exc)[:60]
        snap = registry.get()
        stages = {f.stage.split(" of ")[0] for f in snap.failures}
        if snap.conflicts:
            stages.add("conflict")
        if snap.settings.errors:
            stages.add("file skipped")
        return "answers", outcome, "; ".join(sorted(stages)) or "-"
    accelreg.reset()


def table() -> str:
    """The fault table of docs/reliability.md."""
    rows = [
        "| fault | healthy xpu | faulty backend's callers get | recorded as | strict mode |",
        "| --- | --- | --- | --- | --- |",
    ]
    import os

    home = os.getcwd()
    for fault in FAULTS:
        healthy, faulty, recorded = _row(fault, strict=False)
        _, strict_kind, _ = _row(fault, strict=True)
        os.chdir(home)
        rows.append(f"| {fault.name} | {healthy} | {faulty} | {recorded} | {strict_kind} |")
    accelreg.reset()
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
