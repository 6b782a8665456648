"""The conformance kit: the checks a vendor runs against its own backend plugin."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import accelreg
from accelreg import registry
from accelreg.dtypes import COMPUTE_DTYPES, try_dtypes
from accelreg.integrations.vllm import check_declared
from accelreg.types import PlacementRule

__all__ = ["BackendConformance"]

#: Run in a fresh interpreter under a visible-devices mask: what the registry and the runtime see.
_UNDER_MASK = """
import json, sys
import accelreg
from accelreg import registry
from accelreg.integrations.vllm import check_declared
backend, settings = sys.argv[1], json.loads(sys.argv[2])
if settings:
    accelreg.configure(**settings)
b = registry.get().backend(backend)
out = {"registry": b.count, "reason": b.probe().availability.reason}
import torch
mod = getattr(torch, b.device_type, None)
out["module"] = mod is not None
if mod is not None:
    out["runtime"] = int(mod.device_count()) if hasattr(mod, "device_count") else None
    try:
        out["is_available"] = repr(mod.is_available())
    except Exception as exc:
        out["is_available"] = f"raised {type(exc).__name__}: {exc}"
memory = b.memory(0) if b.count else None
out["total0"] = memory.total if memory is not None else None
print(json.dumps(out))
"""


class BackendConformance:
    """Conformance suite for a backend plugin. Subclass it in a test module and set ``backend``.

    ::

        from accelreg.testing import BackendConformance

        class TestAcme(BackendConformance):
            backend = "acme"

    Every check runs against the real runtime in the current process: availability with a
    reason, device count, resolve round trips for every index, a tensor allocated and read
    back on each device, memory info consistent with an allocation, visible-devices parsing,
    the runtime's versions and each device's name (what ``accelreg env`` shows),
    ``torch.<device_type>.is_available()`` answering (never raising), what each device computes
    in (:func:`accelreg.capabilities`: bfloat16 and float16 answered, every dtype answered
    ``True`` computed on the device, agreeing with ``torch.<device_type>.is_bf16_supported()``),
    well-formed placement rules, and the vLLM platform the backend declares, if any (installed,
    loads, imports). One check starts fresh interpreters: under the backend's visible-devices variable
    naming one device, the registry *and the runtime* (``torch.<device_type>.device_count()``)
    must see exactly that device — a runtime that ignores its mask would put every rank of a
    job on the same devices — and, where the devices' memory totals tell them apart, logical
    device 0 must be the physical device named.

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
        accelreg.reset()
        if self.settings:
            accelreg.configure(**self.settings)
        yield
        accelreg.reset()

    def _info(self) -> Any:
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
        info = self._info()
        assert isinstance(info.device_count, int) and info.device_count >= 1
        assert accelreg.device_count(self.backend) == info.device_count
        assert len(info.devices()) == (info.device_count if info.indexed else 1)

    def test_resolve_round_trips_for_every_index(self) -> None:
        import torch

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

        info = self._info()
        b = registry.get().backend(self.backend)
        before = b.memory(0)
        if before is None:
            pytest.skip(f"{self.backend} reports no memory info (its spec has no memory_info)")
        assert 0 <= before.free <= before.total
        n = self.memory_probe_bytes
        if before.free < 2 * n:
            pytest.skip(f"{self.backend}:0 has only {before.free} bytes free; need {2 * n} for this check")

        block = torch.empty(n, dtype=torch.uint8, device=accelreg.resolve(0, backend=self.backend))
        after = b.memory(0)
        assert after is not None and after.total == before.total
        assert before.free - after.free >= n * 0.9, (
            f"free memory did not drop by ~{n} bytes: {before} -> {after}"
        )
        del block
        assert info.available

    def test_visible_devices_parsing(self, monkeypatch: pytest.MonkeyPatch) -> None:
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

    def test_versions_and_device_names(self) -> None:
        info = self._info()
        b = registry.get().backend(self.backend)
        if b.spec.versions is None and b.spec.device_name is None:
            pytest.skip(
                f"{self.backend} declares neither versions nor device_name (accelreg env shows neither)"
            )
        versions = b.versions()
        names = [b.device_name(i) for i in range(info.device_count if info.indexed else 1)]
        stages = {f"probe versions of {self.backend!r}", f"probe device_name of {self.backend!r}"}
        failed = [str(f) for f in registry.get().failures if f.stage in stages]
        assert not failed, failed
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items())
        if b.spec.device_name is not None:
            assert all(names), f"device_name answered no name for some device: {names}"

    def test_device_module_answers_is_available(self) -> None:
        """transformers, accelerate and DeepSpeed ask ``torch.<device_type>.is_available()`` to
        decide; an exception there breaks their import or their device choice."""
        import torch

        info = self._info()
        module = getattr(torch, info.device_type, None)
        assert module is not None, (
            f"torch.{info.device_type} does not exist once {self.backend} is probed: the runtime must "
            "register its device module (torch._register_device_module)"
        )
        fn = getattr(module, "is_available", None)
        assert callable(fn), f"torch.{info.device_type} has no is_available()"
        try:
            answer = fn()
        except Exception as exc:  # noqa: BLE001 - the finding this check reports
            pytest.fail(
                f"torch.{info.device_type}.is_available() raised {type(exc).__name__}: {exc}; it must answer "
                "True or False",
                pytrace=False,
            )
        assert answer is True, (
            f"torch.{info.device_type}.is_available() answered {answer!r} on an available backend"
        )

    def test_compute_dtypes(self) -> None:
        """What each device computes in, as :func:`accelreg.capabilities` answers it: answers
        well-formed and without a failed probe; bfloat16 and float16 known (frameworks decide
        mixed precision by them: declare ``BackendSpec.dtypes`` where the runtime cannot say);
        every dtype answered ``True`` computed on the device (:func:`accelreg.dtypes.try_dtypes`);
        and bfloat16 as ``torch.<device_type>.is_bf16_supported()`` answers, where it exists
        (transformers asks it directly)."""
        import torch

        info = self._info()
        problems: list[str] = []
        for i in range(info.device_count if info.indexed else 1):
            caps = accelreg.capabilities(i, backend=self.backend)
            device = accelreg.resolve(i, backend=self.backend)
            assert caps.backend == self.backend and caps.device == str(device), caps
            assert tuple(d.dtype for d in caps.dtypes[: len(COMPUTE_DTYPES)]) == COMPUTE_DTYPES, caps
            for d in caps.dtypes:
                assert d.supported in (True, False, None) and d.reason.strip(), d
                assert d.source in ("declared", "probe", "runtime", "unknown"), d
            for name in ("bfloat16", "float16"):
                d = caps.support(name)
                if d.supported is None:
                    problems.append(
                        f"{caps.device}: nobody says whether it computes in {name} ({d.reason}); declare it in "
                        f"BackendSpec.dtypes, or give torch.{info.device_type} is_bf16_supported() / "
                        "get_amp_supported_dtype()"
                    )
            claimed = [d.dtype for d in caps.dtypes if d.supported and d.dtype in COMPUTE_DTYPES]
            if claimed:
                tried = try_dtypes(device)
                problems += [
                    f"{caps.device}: answered that it computes in {name} ({caps.support(name).reason}), but "
                    f"{tried[name][1]}"
                    for name in claimed
                    if not tried[name][0]
                ]
        stage = f" of {self.backend!r}"
        failed = [
            str(f)
            for f in registry.get().failures
            if f.stage.endswith(stage)
            and ("dtypes" in f.stage or "_supported" in f.stage or "amp" in f.stage)
        ]
        problems += [f"a probe failed: {f}" for f in failed]
        module = getattr(torch, info.device_type, None)
        ask = getattr(module, "is_bf16_supported", None)
        if callable(ask):
            theirs = ask()
            mine = accelreg.capabilities(0, backend=self.backend).support("bfloat16")
            if mine.known and theirs is not mine.supported:
                problems.append(
                    f"torch.{info.device_type}.is_bf16_supported() answers {theirs!r}, the registry "
                    f"{mine.supported!r} ({mine.reason}): frameworks that ask torch would decide otherwise"
                )
        assert not problems, "; ".join(problems)

    def _single_device_values(self, count: int) -> list[tuple[str, int]]:
        """Values of the visible-devices variable that name one physical device: ``(value, id)``."""
        out = []
        for physical in range(min(count, 2)):
            if self.visible_devices_samples is None:
                out.append((str(physical), physical))
                continue
            for value, expected in self.visible_devices_samples:
                if tuple(expected) == (str(physical),):
                    out.append((value, physical))
                    break
        return out

    def test_runtime_honours_its_visible_devices_variable(self) -> None:
        """In fresh interpreters masked to one device: the runtime and the registry see exactly
        it, and (where the devices' memory totals differ) as logical device 0."""
        info = self._info()
        var = info.visible_devices_var
        if var is None:
            pytest.skip(f"{self.backend} declares no visible-devices variable")
        values = self._single_device_values(info.device_count)
        assert values, (
            "visible_devices_samples has no value naming device 0 alone (expected ids ('0',)); add one"
        )
        b = registry.get().backend(self.backend)
        totals = []
        for i in range(info.device_count):
            memory = b.memory(i)
            totals.append(memory.total if memory is not None else None)
        for value, physical in values:
            env = {k: v for k, v in os.environ.items() if k != var}
            env[var] = value
            proc = subprocess.run(
                [sys.executable, "-c", _UNDER_MASK, self.backend, json.dumps(self.settings)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, f"{var}={value!r}: the child failed\n{proc.stderr[-3000:]}"
            got = json.loads(proc.stdout.splitlines()[-1])
            where = f"in a process with {var}={value!r} (physical device {physical} only)"
            assert got["module"], f"{where} torch.{info.device_type} does not exist"
            assert got["runtime"] == 1, (
                f"{where} torch.{info.device_type}.device_count() is {got['runtime']}: the runtime ignores "
                f"{var}, so every rank of a job would see every device"
            )
            assert got["registry"] == 1, (
                f"{where} the registry counts {got['registry']} {self.backend} device(s): {got['reason']}"
            )
            assert got["is_available"] == "True", (
                f"{where} torch.{info.device_type}.is_available(): {got['is_available']}"
            )
            distinct = None not in totals and len(set(totals)) == len(totals)
            if distinct:
                assert got["total0"] == totals[physical], (
                    f"{where} logical device 0 has {got['total0']} bytes, but physical device {physical} has "
                    f"{totals[physical]}: the runtime does not map the mask's device to logical 0"
                )

    def test_placement_rules_well_formed(self) -> None:
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

    def test_declared_vllm_platform_loads(self) -> None:
        """A backend that declares a vLLM platform (``BackendSpec.vllm_platform``): with vLLM
        installed, each declared platform is vLLM's own or an installed platform plugin, its
        plugin loads and answers without raising, the platform class it names imports, and
        (the backend being available) one of them is active. Skipped when the backend declares
        none, when vLLM is not installed, and when a declared plugin is not installed here."""
        self._info()
        if not registry.get().backend(self.backend).spec.vllm_platform:
            pytest.skip(f"{self.backend} declares no vLLM platform (accelreg's registry platform serves it)")
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("vLLM is not installed here: the declared vLLM platform cannot be checked")
        problems, missing = check_declared(self.backend)
        assert not problems, "; ".join(problems)
        if missing:
            pytest.skip("; ".join(missing))
