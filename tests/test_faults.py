"""Fault injection: broken, hanging, lying, exiting, re-entering, duplicate or vanished plugins,
invalid placement rules and broken config files.

For every fault the registry keeps answering for the healthy backend (a scripted ``xpu`` with
two devices), the fault is recorded, the RuntimeWarnings it gives are the expected ones, and
strict mode turns it into an error. ``python tests/test_faults.py`` prints the table for
docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import accelreg
from accelreg import AccelregError, ConfigError, PluginError
from accelreg.types import PlacementRule

try:
    from ._fakes import LyingInt, make_dist, plugin, spec
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests._fakes import LyingInt, make_dist, plugin, spec

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


def _exit(*args: Any) -> Any:
    sys.exit(4)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")


def _unprintable(*args: Any) -> Any:
    raise _Unprintable()


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr() raises")

    def __bool__(self) -> bool:
        raise RuntimeError("bool() raises")


def _reenter(*args: Any) -> Any:
    accelreg.resolve()  # a probe asking the registry it is helping to build
    return True


@dataclass(frozen=True)
class Fault:
    name: str
    setup: Callable[[Any, Path], None]
    warns: str | None = None  # the RuntimeWarning the fault gives (a regex), if any
    strict: bool = True  # whether strict mode turns it into an error (warnings-only faults do not)


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


def _bad_import(source: str) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        module = f"fakeplugin_import{abs(hash(source)) % 10**8}"
        root = make_dist(tmp / "d1", "broken-accel", "2.0", module, source, "acme")
        monkeypatch.syspath_prepend(str(root))
        _register()

    return setup


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


def _hook(impl: Callable[[], Any]) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        class Bad:
            @accelreg.hookimpl
            def accelreg_backends(self):
                return impl()

        accelreg.register(Bad(), "fakeplugin_hook")
        accelreg.register(plugin(spec("xpu", 2, priority=90)), "fakeplugin_healthy")

    return setup


def _cannot_enumerate() -> Any:
    raise RuntimeError("cannot enumerate")


def _rules(make: Callable[[str], Any]) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        _register(rules=make)

    return setup


def _rule(**fields: Any) -> Callable[[str], Any]:
    return lambda backend: [
        PlacementRule(backend=backend, quant_method="q8", module_classes=("m.Q8",), **fields)
    ]


def _config(content: bytes | str, where: str = "work/accelreg.toml") -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        path = tmp / where
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        _register()

    return setup


def _env(var: str, value: str) -> Callable[[Any, Path], None]:
    def setup(monkeypatch: Any, tmp: Path) -> None:
        monkeypatch.setenv(var, value)
        _register()

    return setup


def _cwd_deleted(monkeypatch: Any, tmp: Path) -> None:
    gone = tmp / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    _register()


def _unreadable(monkeypatch: Any, tmp: Path) -> None:
    monkeypatch.setenv("ACCELREG_CONFIG", str(tmp / "nowhere" / "config.toml"))
    (tmp / "work" / "accelreg.toml").mkdir()  # a folder where the file should be
    _register()


NESTED = "x = " + "[" * 5000 + "]" * 5000 + "\n"
SKIPPED = "configuration file skipped"

FAULTS = [
    *(Fault(f"{f} raises", _with(f, _boom)) for f in CALLABLES),
    *(Fault(f"{f} hangs", _with(f, _hang)) for f in CALLABLES),
    Fault("is_available calls sys.exit(4)", _with("is_available", _exit)),
    Fault("device calls sys.exit(4)", _with("device", _exit)),
    Fault("is_available raises an exception whose str() raises", _with("is_available", _unprintable)),
    Fault("is_available returns a value whose repr() raises", _nonsense("is_available", _BadRepr())),
    Fault("is_available calls accelreg.resolve()", _with("is_available", _reenter)),
    Fault("is_available returns a string", _nonsense("is_available", "yes")),
    Fault("device_count returns -1", _nonsense("device_count", -1)),
    Fault("device_count returns 2.5", _nonsense("device_count", 2.5)),
    Fault("device_count returns True", _nonsense("device_count", True)),
    Fault("current_index returns 7", _nonsense("current_index", 7)),
    Fault("device returns a cpu device", _nonsense("device", torch.device("cpu"))),
    Fault("memory_info returns free > total", _nonsense("memory_info", accelreg.MemoryInfo(free=5, total=1))),
    Fault("parse_visible_devices returns ints", _nonsense("parse_visible_devices", (0, 1))),
    Fault("plugin fails to import", _bad_import("raise ImportError('libacme.so missing')")),
    Fault("plugin import calls sys.exit(4)", _bad_import("import sys\nsys.exit(4)")),
    Fault("plugin import hangs", _hang_on_import),
    Fault("accelreg_backends raises", _hook(_cannot_enumerate)),
    Fault("accelreg_backends calls sys.exit(4)", _hook(_exit)),
    Fault("accelreg_backends calls accelreg.resolve()", _hook(lambda: [accelreg.resolve()])),
    Fault("accelreg_backends yields a non-spec", _hook(lambda: [_BadRepr()])),
    Fault("accelreg_placement_rules raises", _rules(lambda backend: _boom())),
    Fault("placement rule bits_per_element=-8", _rules(_rule(bits_per_element=-8))),
    Fault("placement rule bits_per_element='eight'", _rules(_rule(bits_per_element="eight"))),
    Fault("placement rule offload={'gpu'}", _rules(_rule(offload=frozenset({"gpu"})))),
    Fault("two plugins register one name", _duplicate),
    Fault("plugin removed between runs", _removed, strict=False),
    Fault("config file malformed", _config("priority = [\n"), warns=SKIPPED),
    Fault("config file not UTF-8", _config(b"\xff\xfe\x00"), warns=SKIPPED),
    Fault("config file huge (2 MiB)", _config("#" + "x" * (2 << 20)), warns=SKIPPED),
    Fault("config file unreadable", _unreadable, warns=SKIPPED),
    Fault("config file nests arrays 5,000 deep", _config(NESTED), warns=SKIPPED),
    Fault("config file has a 5,000-digit integer", _config("probe_timeout = " + "9" * 5000), warns=SKIPPED),
    Fault("config probe_timeout = 1 and 400 zeros", _config("probe_timeout = 1" + "0" * 400), warns=SKIPPED),
    Fault(
        "pyproject.toml [tool.other] nests 5,000 deep", _config(NESTED, "work/pyproject.toml"), warns=SKIPPED
    ),
    Fault("user config file nests 5,000 deep", _config(NESTED, "xdg/accelreg/config.toml"), warns=SKIPPED),
    Fault(
        "config file has an unknown key", _config("probe_timout = 5\n"), warns="unknown setting", strict=False
    ),
    Fault(
        "providers names a distribution not installed",
        _env("ACCELREG_PROVIDERS", "cuda=acme-cuda"),
        warns="no distribution 'acme-cuda' is installed",
    ),
    Fault("working directory deleted", _cwd_deleted, warns="working directory", strict=False),
]


@contextlib.contextmanager
def expect_warning(pattern: str | None) -> Iterator[None]:
    """accelreg's RuntimeWarnings in the block: one matching ``pattern`` (none when ``None``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    ours = [str(w.message) for w in caught if str(w.message).startswith("accelreg: ")]
    if pattern is None:
        assert not ours, f"unexpected warnings: {ours}"
    else:
        assert any(re.search(pattern, m) for m in ours), f"no warning matching {pattern!r} in {ours}"


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
    with expect_warning(fault.warns):
        _exercise(fault)
    assert time.perf_counter() - start < 10, "a hanging plugin held up the healthy caller"
    from accelreg import registry

    snap = registry.get()
    recorded = snap.failures or snap.warnings or snap.conflicts or snap.settings.errors
    if fault.name == "plugin removed between runs":
        assert "acme" not in snap.by_name  # gone cleanly: nothing stale is left to record
    else:
        assert recorded, f"{fault.name}: nothing was recorded"


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.strict], ids=lambda f: f.name)
def test_strict_mode_turns_the_fault_into_an_error(fault, monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    monkeypatch.setenv("ACCELREG_PROBE_TIMEOUT", "0.3")
    from accelreg import registry

    raised: list[BaseException] = []
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")  # strict mode is about errors; warnings are tested above
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
    stack.close()
    assert raised, f"strict mode let {fault.name!r} pass silently"


def test_reentry_fails_the_plugin_at_once_not_after_the_timeout():
    accelreg.configure(probe_timeout=30.0)
    _with("is_available", _reenter)(None, Path())
    start = time.perf_counter()
    assert accelreg.resolve(1) == HEALTHY
    assert time.perf_counter() - start < 5, "the re-entering probe waited for the timeout"
    (failure,) = accelreg.failures()
    assert failure.stage == "probe is_available of 'cuda'" and "called back into accelreg" in failure.error


def test_a_plugin_that_swallows_the_reentry_refusal_still_fails():
    def sneaky() -> bool:
        try:
            accelreg.backends()
        except Exception:  # noqa: BLE001 - what a careless plugin does
            pass
        return True

    _with("is_available", sneaky)(None, Path())
    assert accelreg.resolve(1) == HEALTHY
    assert "called back into accelreg" in accelreg.failures()[0].error


def test_keyboard_interrupt_from_a_probe_still_propagates():
    def interrupted() -> bool:
        raise KeyboardInterrupt

    _with("is_available", interrupted)(None, Path())
    with pytest.raises(KeyboardInterrupt):
        accelreg.resolve()


def test_tiny_probe_timeout_keeps_the_builtins_and_cpu(monkeypatch):
    monkeypatch.setenv("ACCELREG_PROBE_TIMEOUT", "1e-9")
    accelreg.reset()
    assert accelreg.resolve("cpu") == torch.device("cpu")
    names = {b.name for b in accelreg.backends()}
    assert {"cpu", "cuda", "npu", "xpu", "hpu"} <= names
    cpu = {b.name: b for b in accelreg.backends()}["cpu"]
    assert cpu.available and cpu.device_count == 1


def test_a_plugin_mutating_its_frozen_spec_changes_nothing():
    original = spec("cuda", 2, priority=100)
    accelreg.register(plugin(original), "fakeplugin_mutating")
    assert accelreg.resolve(1) == torch.device("cuda", 1)
    object.__setattr__(original, "device_type", "xpu")
    object.__setattr__(original, "indexed", False)
    object.__setattr__(original, "name", "npu")
    assert accelreg.resolve("cuda:0") == torch.device("cuda", 0)  # not cached yet: read from the copy
    assert accelreg.current_backend().name == "cuda" and accelreg.device_count() == 2


def test_spec_fields_of_the_wrong_type_are_refused():
    bad = [
        spec("acme", 1, device_type="ve", indexed="yes"),
        spec("acme2", 1, device_type="ve", var="NOT A VAR"),
        spec("acme3", 1, device_type="ve", runtime_package="no such/package"),
        spec("cpu", 1),  # the cpu backend is accelreg's own
    ]
    accelreg.register(plugin(*bad), "fakeplugin_badfields")
    assert accelreg.resolve() == torch.device("cpu")
    errors = " | ".join(f.error for f in accelreg.failures())
    for fragment in ("indexed", "visible_devices_var", "runtime_package", "cpu backend is accelreg's own"):
        assert fragment in errors, (fragment, errors)
    assert "_Nonsense" not in errors and "Nonsense:" not in errors  # no internal class names


def test_int_subclasses_are_read_by_their_value_not_their_methods():
    accelreg.register(
        plugin(spec("cuda", LyingInt(2), priority=100, current=LyingInt(1))), "fakeplugin_lying"
    )
    assert accelreg.device_count() == 2 and {b.name: b for b in accelreg.backends()}["cuda"].device_count == 2
    assert accelreg.resolve() == torch.device("cuda", 1)
    assert accelreg.resolve(LyingInt(1)) == torch.device("cuda", 1)  # not cuda:0, which int() says
    assert not accelreg.failures()


def test_an_invalid_rule_never_reaches_the_planner():
    from accelreg.builtin import bnb

    bad = PlacementRule(
        backend="*", quant_method="bnb_8bit", module_classes=bnb.EIGHT_BIT_CLASSES, bits_per_element=-8
    )
    accelreg.register(plugin(rules=lambda backend: [bad]), "fakeplugin_badrule")
    rule = accelreg.placement_rule("npu", "bnb_8bit")
    assert rule.provider == "accelreg" and rule.bits_per_element == 8  # the built-in one, not -8
    assert rule.quantized_nbytes((40, 1024)) > 0
    (failure,) = accelreg.failures()
    assert "bits_per_element must be in (0, 64], got -8" in failure.error


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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
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
        if snap.warnings and not stages:
            stages.add("warning")
        return "answers", outcome, "; ".join(sorted(stages)) or "-"
    accelreg.reset()


def table() -> str:
    """The fault table of docs/reliability.md."""
    rows = [
        "| fault | healthy xpu | faulty backend's callers get | recorded as | strict mode |",
        "| --- | --- | --- | --- | --- |",
    ]
    home = os.getcwd()
    for fault in FAULTS:
        healthy, faulty, recorded = _row(fault, strict=False)
        os.chdir(home)
        strict_healthy, strict_kind, _ = _row(fault, strict=True)
        os.chdir(home)
        if strict_healthy != "-":
            strict_kind = "answers (not an error)"
        rows.append(f"| {fault.name} | {healthy} | {faulty} | {recorded} | {strict_kind} |")
    accelreg.reset()
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
