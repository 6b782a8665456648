"""pytest plugin and backend conformance kit.

Installed as a pytest plugin (entry point ``pytest11: accelreg``), this module gives:

* the ``accelreg_fresh`` fixture — a registry rebuilt from a clean environment;
* the ``accelreg_emu(name="npu", devices=2, memory=None, **env)`` marker — the marked tests run
  in a fresh ``python -m pytest`` subprocess with the emulated accelerator presenting itself as
  ``name`` (one PrivateUse1 name per process); tests of one module with the same marker
  arguments share one subprocess;
* :func:`run_python` / the ``emu_python`` fixture — run a code string in such a subprocess;
* :class:`BackendConformance` — the suite a vendor points at its own plugin.

Nothing here imports torch until a test needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .builtin import visible_devices_vars

__all__ = ["BackendConformance", "PythonResult", "clean_environ", "run_python"]

#: Set in a child started by the ``accelreg_emu`` marker: run the test body here.
CHILD_VAR = "ACCELREG_TESTING_CHILD"
_RESULTS_VAR = "ACCELREG_TESTING_RESULTS"
#: Variables a fresh registry must not inherit (the emulator's own ``ACCELREG_EMU_*`` and the
#: testing variables are kept: they describe the process, not the configuration under test).
_KEEP_PREFIXES = ("ACCELREG_EMU_", "ACCELREG_TESTING_")
#: Launcher variables: a local rank picks the device, and any of them makes resolve() refuse a
#: silent cpu fallback (see accelreg.registry.LAUNCHER_VARS).
_LAUNCHER_VARS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "RANK",
    "WORLD_SIZE",
)


def _registry_vars() -> set[str]:
    """Every variable that changes what the registry answers: ACCELREG_*, ranks, masks."""
    names = {k for k in os.environ if k.startswith("ACCELREG_") and not k.startswith(_KEEP_PREFIXES)}
    names.update(_LAUNCHER_VARS)
    names.update(visible_devices_vars())  # each built-in backend's masking variable
    names.add("ACCELREG_EMU_VISIBLE_DEVICES")
    return names


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` without registry-affecting variables, plus ``extra``."""
    drop = _registry_vars()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


@pytest.fixture
def accelreg_fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A registry built from a clean environment, in an empty working directory."""
    import accelreg

    for key in _registry_vars():
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    accelreg.reset()
    yield
    accelreg.reset()


# -- subprocesses -------------------------------------------------------------------------
def emu_environ(
    name: str = "emu", devices: int = 2, memory: str | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a process whose emulated accelerator is ``name`` x ``devices``."""
    env = clean_environ({"ACCELREG_EMU_NAME": name, "ACCELREG_EMU_DEVICES": str(devices)})
    if memory is not None:
        env["ACCELREG_EMU_MEMORY"] = str(memory)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass(frozen=True)
class PythonResult:
    """What a child Python process printed; ``value`` is the last line parsed as JSON, if any."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def value(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else None


def run_python(
    code: str,
    *,
    name: str | None = "emu",
    devices: int = 2,
    memory: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    cwd: str | Path | None = None,
) -> PythonResult:
    """Run ``code`` in a fresh interpreter with the emulator as ``name`` (``None``: no emulator).

    With ``check`` a non-zero exit raises ``AssertionError`` carrying the child's output.
    """
    full = emu_environ(name, devices, memory) if name is not None else clean_environ()
    full.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout, cwd=cwd
    )
    result = PythonResult(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"child python (emulator {name!r} x {devices}) exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return result


@pytest.fixture
def emu_python() -> Any:
    """:func:`run_python`, as a fixture."""
    return run_python


# -- the accelreg_emu marker --------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "accelreg_emu(name='emu', devices=2, memory=None, **env): run in a subprocess whose emulated "
        "accelerator presents itself as `name` with `devices` devices",
    )
    if os.environ.get(_RESULTS_VAR):
        config.pluginmanager.register(_ChildReporter(os.environ[_RESULTS_VAR]), "accelreg-child-reporter")


class _ChildReporter:
    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "longrepr": str(report.longrepr) if report.longrepr else "",
            "skip": list(report.longrepr) if report.skipped and isinstance(report.longrepr, tuple) else None,
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def _marker_key(item: pytest.Item) -> tuple[str, str] | None:
    mark = item.get_closest_marker("accelreg_emu")
    if mark is None:
        return None
    kwargs = dict(mark.kwargs)
    if mark.args:
        kwargs.setdefault("name", mark.args[0])
    return item.nodeid.split("::", 1)[0], json.dumps(kwargs, sort_keys=True)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if os.environ.get(CHILD_VAR):
        return
    groups: dict[tuple[str, str], list[pytest.Item]] = {}
    for item in items:
        key = _marker_key(item)
        if key is not None:
            groups.setdefault(key, []).append(item)
    for key, members in groups.items():
        group = _Group(config, key, [m.nodeid for m in members])
        for item in members:
            item.runtest = _delegate(group, item.nodeid)  # type: ignore[method-assign]


class _Group:
    """Marked tests of one module sharing marker arguments: one child pytest runs them all."""

    def __init__(self, config: pytest.Config, key: tuple[str, str], nodeids: list[str]) -> None:
        self.rootdir = str(config.rootpath)
        self.kwargs = json.loads(key[1])
        self.nodeids = nodeids
        self.results: dict[str, list[dict[str, Any]]] | None = None
        self.output = ""

    def run(self) -> dict[str, list[dict[str, Any]]]:
        if self.results is not None:
            return self.results
        kwargs = dict(self.kwargs)
        name = kwargs.pop("name", "emu")
        devices = int(kwargs.pop("devices", 2))
        memory = kwargs.pop("memory", None)
        timeout = float(kwargs.pop("timeout", 600))
        with tempfile.TemporaryDirectory(prefix="accelreg-child-") as tmp:
            results_path = os.path.join(tmp, "results.jsonl")
            env = emu_environ(name, devices, memory, **kwargs)
            env.update({CHILD_VAR: "1", _RESULTS_VAR: results_path})
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--no-header",
                *self.nodeids,
            ]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=self.rootdir, timeout=timeout
            )
            self.output = proc.stdout[-6000:] + proc.stderr[-6000:]
            results: dict[str, list[dict[str, Any]]] = {}
            if os.path.exists(results_path):
                with open(results_path, encoding="utf-8") as fh:
                    for line in fh:
                        entry = json.loads(line)
                        results.setdefault(entry["nodeid"], []).append(entry)
        self.results = results
        return results


def _delegate(group: _Group, nodeid: str) -> Any:
    def runtest() -> None:
        reports = group.run().get(nodeid)
        label = f"[child: emulator {group.kwargs.get('name', 'emu')!r} x {group.kwargs.get('devices', 2)}]"
        if not reports:
            pytest.fail(f"{label} the child never ran {nodeid}:\n{group.output}", pytrace=False)
        for report in reports:
            if report["outcome"] == "failed":
                pytest.fail(f"{label} {report['when']} failed:\n{report['longrepr']}", pytrace=False)
        for report in reports:
            if report["outcome"] == "skipped":
                reason = report["skip"][2] if report["skip"] else report["longrepr"]
                pytest.skip(f"{label} {reason}")

    return runtest


# -- the conformance kit ------------------------------------------------------------------
class BackendConformance:
    """Conformance suite for a backend plugin. Subclass it in a test module and set ``backend``.

    ::

        from accelreg.testing import BackendConformance

        class TestAcme(BackendConformance):
            backend = "acme"

    Every check runs against the real runtime in the current process: availability with a
    reason, device count, resolve round trips for every index, a tensor allocated and read
    back on each device, memory info consistent with an allocation, visible-devices parsing,
    and well-formed placement rules.

    Class attributes a vendor may set:

    * ``backend`` — the backend name under test (required).
    * ``settings`` — passed to :func:`accelreg.configure` before each check, e.g.
      ``{"disable": ["emu"]}`` or ``{"providers": {"npu": "acme-npu"}}``.
    * ``memory_probe_bytes`` — size of the allocation the memory check makes on device 0
      (default 64 MiB); the check is skipped when the backend declares no ``memory_info`` (or it
      answers ``None``) and when the device has less than twice this much free.
    * ``visible_devices_samples`` — ``((value, expected ids), ...)``: values of the backend's
      visible-devices variable in the runtime's own syntax and the physical ids the parser must
      return for each. Default: comma-separated ids, ``"0"`` and ``"1,0"``, which is what the
      default parser accepts; a backend whose ``parse_visible_devices`` reads another syntax sets
      its own. (``""``, no device visible, is the registry's to handle: the kit never sends it.)
    """

    backend: str = ""
    memory_probe_bytes: int = 64 << 20
    settings: dict[str, Any] = {}  # noqa: RUF012 - read-only class default
    visible_devices_samples: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @pytest.fixture(autouse=True)
    def _fresh(self) -> Iterator[None]:
        import accelreg

        accelreg.reset()
        if self.settings:
            accelreg.configure(**self.settings)
        yield
        accelreg.reset()

    def _info(self) -> Any:
        import accelreg

        assert self.backend, "set `backend` on the BackendConformance subclass"
        infos = {b.name: b for b in accelreg.backends()}
        assert self.backend in infos, f"{self.backend!r} is not registered; registered: {', '.join(infos)}"
        return infos[self.backend]

    def test_available_with_a_reason(self) -> None:
        info = self._info()
        assert info.available, f"{self.backend} is unavailable: {info.reason}"
        assert isinstance(info.reason, str) and info.reason.strip()
        assert info.provider, "the backend should name its distribution"

    def test_device_count(self) -> None:
        import accelreg

        info = self._info()
        assert isinstance(info.device_count, int) and info.device_count >= 1
        assert accelreg.device_count(self.backend) == info.device_count
        assert len(info.devices()) == (info.device_count if info.indexed else 1)

    def test_resolve_round_trips_for_every_index(self) -> None:
        import torch

        import accelreg

        info = self._info()
        for i in range(info.device_count):
            dev = accelreg.resolve(i, backend=self.backend)
            assert isinstance(dev, torch.device) and dev.type == info.device_type
            if info.indexed:
                assert dev.index == i
            assert accelreg.resolve(str(dev)) == dev
            assert accelreg.resolve(dev) == dev
        for bad in (info.device_count, -1):
            with pytest.raises(accelreg.DeviceError):
                accelreg.resolve(bad, backend=self.backend)
        with pytest.raises(TypeError):
            accelreg.resolve(True, backend=self.backend)

    def test_tensor_on_each_device(self) -> None:
        import torch

        import accelreg

        info = self._info()
        for i in range(info.device_count if info.indexed else 1):
            dev = accelreg.resolve(i, backend=self.backend)
            x = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)
            # an index-less device ("hpu") means the process's current one
            assert x.device.type == dev.type and (dev.index is None or x.device.index == dev.index)
            y = (x * 2 + 1).sum(dim=0)
            assert torch.equal(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2 + 1).sum(dim=0))

    def test_memory_info_tracks_an_allocation(self) -> None:
        import torch

        from accelreg import registry

        info = self._info()
        b = registry.get().backend(self.backend)
        before = b.memory(0)
        if before is None:
            pytest.skip(f"{self.backend} reports no memory info (its spec has no memory_info)")
        assert 0 <= before.free <= before.total
        n = self.memory_probe_bytes
        if before.free < 2 * n:
            pytest.skip(f"{self.backend}:0 has only {before.free} bytes free; need {2 * n} for this check")
        import accelreg

        block = torch.empty(n, dtype=torch.uint8, device=accelreg.resolve(0, backend=self.backend))
        after = b.memory(0)
        assert after is not None and after.total == before.total
        assert before.free - after.free >= n * 0.9, (
            f"free memory did not drop by ~{n} bytes: {before} -> {after}"
        )
        del block
        assert info.available

    def test_visible_devices_parsing(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import accelreg
        from accelreg import registry

        info = self._info()
        var = info.visible_devices_var
        if var is None:
            pytest.skip(f"{self.backend} declares no visible-devices variable")
        samples = self.visible_devices_samples
        own_syntax = samples is not None
        if samples is None:
            samples = (("0", ("0",)), ("1,0", ("1", "0")))
        assert samples, "visible_devices_samples is empty: give ((value, expected ids), ...)"
        for value, expected in samples:
            assert value.strip(), "visible_devices_samples: the kit does not send empty values"
            monkeypatch.setenv(var, value)
            accelreg.reset()
            accelreg.configure(**self.settings)
            probed = registry.get().backend(self.backend).probe()
            got = (probed.visible, probed.visible_error)
            hint = (
                ""
                if own_syntax
                else f"; if {self.backend}'s runtime reads another syntax, set visible_devices_samples "
                "= ((value, expected ids), ...) on the test class"
            )
            assert got == (tuple(expected), None), f"{var}={value!r} parsed as {got}, not {expected}{hint}"
        monkeypatch.delenv(var)
        accelreg.reset()
        accelreg.configure(**self.settings)
        probed = registry.get().backend(self.backend).probe()
        assert (probed.visible, probed.visible_error) == (None, None)

    def test_placement_rules_well_formed(self) -> None:
        from accelreg import registry
        from accelreg.types import PlacementRule

        rules = registry.get().rules(self.backend)
        for _plugin, rule in rules:
            assert isinstance(rule, PlacementRule)
            assert rule.backend in (self.backend, "*")
            assert rule.quant_method and rule.module_classes
            assert rule.travelling_keys and any(
                k == rule.param or k.startswith(rule.param) for k in rule.travelling_keys
            )
            assert rule.offload <= {"cpu", "disk"}
            assert rule.quantized_nbytes((64, 64)) > 0
            for dev in (f"{self.backend}:0", "cpu", "disk"):
                assert isinstance(rule.may_live_on(dev), bool)
        assert not [f for f in registry.get().failures if "placement" in f.stage]
