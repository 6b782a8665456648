"""DeepSpeed's accelerator, chosen by the registry: checks in order, in one fresh interpreter.

    python _accel_checks.py        # one result line per check_* function

No emulator here: the registry's current backend is the cpu. The first checks run before
DeepSpeed is imported (the report must not import it); then :func:`prepare` hands DeepSpeed its
accelerator at import; later checks exercise ``enable()``/``disable()``, a user's
``DS_ACCELERATOR``, and the registry's own accelerator class on a backend DeepSpeed has no class
for (an in-process plugin whose devices are host memory) against the installed DeepSpeed's
abstract interface — which is how the release matrix checks older DeepSpeed releases too.
"""

from __future__ import annotations

import abc
import contextlib
import io
import os
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H

import accelreg
from accelreg.integrations import deepspeed as integration
from accelreg.integrations.deepspeed import handover
from accelreg.types import BackendSpec, MemoryInfo

GiB = 1 << 30


def check_report_before_import_imports_nothing() -> dict:
    report = integration.accelerator_report()
    assert "deepspeed" not in sys.modules, "accelerator_report() imported deepspeed"
    assert report["deepspeed"] == "cpu" and report["accelreg"] == "cpu" and report["agree"], report
    assert report["implementation"] == "DeepSpeed's own cpu class", report
    assert report["how"] == "DeepSpeed not imported yet; accelreg.install() or enable() hands it over", report
    status = integration.INTEGRATION.status()
    assert status["accelerator"]["summary"].startswith("DeepSpeed accelerator cpu"), status
    assert "deepspeed" not in sys.modules, "INTEGRATION.status() imported deepspeed"
    return report


def check_user_ds_accelerator_disagreement_reported_before_import() -> dict:
    os.environ["DS_ACCELERATOR"] = "cuda"
    try:
        report = integration.accelerator_report()
    finally:
        del os.environ["DS_ACCELERATOR"]
    assert report["deepspeed"] == "cuda" and not report["agree"], report
    assert "DISAGREES with accelreg's cpu" in report["summary"] and "set by the user" in report["how"], report
    assert "deepspeed" not in sys.modules
    return {"summary": report["summary"]}


def check_accelreg_env_shows_deepspeed_accelerator_line() -> dict:
    from accelreg import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["env"])
    text = out.getvalue()
    line = next((x.strip() for x in text.splitlines() if x.strip().startswith("DeepSpeed accelerator")), "")
    assert rc == 0 and line.startswith("DeepSpeed accelerator cpu (DeepSpeed's own cpu class"), text
    assert "deepspeed" not in sys.modules, "accelreg env imported deepspeed"
    return {"line": line}


def check_prepare_hands_over_before_deepspeed_picks() -> dict:
    integration.prepare()
    import deepspeed  # noqa: F401 - the import runs the hand-over
    from deepspeed.accelerator import get_accelerator, real_accelerator

    handed = real_accelerator.ds_accelerator
    assert handed is not None and handed is handover._state["handed"], handed
    assert get_accelerator() is handed and type(handed).__name__ == "CPU_Accelerator"
    assert "DS_ACCELERATOR" not in os.environ, "the hand-over must not need DeepSpeed's own ladder"
    report = integration.accelerator_report()
    assert report["how"] == "handed over by accelreg (the registry chose cpu)" and report["agree"], report
    # enable() keeps it; disable() gives DeepSpeed back what it had before accelreg: nothing
    integration.enable()
    assert real_accelerator.ds_accelerator is handed
    integration.disable()
    assert real_accelerator.ds_accelerator is None
    own = get_accelerator()  # DeepSpeed's own ladder again
    assert own is not handed and integration.accelerator_report()["how"].startswith(
        "chosen by DeepSpeed itself"
    )
    return {"summary": report["summary"]}


def check_enable_after_deepspeed_picked_replaces_and_disable_restores() -> dict:
    from deepspeed.accelerator import get_accelerator, real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    picked = CUDA_Accelerator()  # constructible without a GPU: DeepSpeed "picked" cuda
    real_accelerator.set_accelerator(picked)
    before = integration.accelerator_report()
    assert not before["agree"] and "DISAGREES with accelreg's cpu" in before["summary"], before
    integration.enable()
    try:
        ours = get_accelerator()
        assert ours is not picked and ours._name == "cpu" and ours is handover._state["handed"]
        after = integration.accelerator_report()
        assert after["agree"] and after["how"].startswith("handed over by accelreg"), after
    finally:
        integration.disable()
    assert real_accelerator.ds_accelerator is picked, "disable() did not give DeepSpeed back its choice"
    real_accelerator.ds_accelerator = None
    return {"before": before["summary"], "after": after["summary"]}


def check_user_ds_accelerator_is_left_alone() -> dict:
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    picked = CUDA_Accelerator()
    real_accelerator.set_accelerator(picked)
    os.environ["DS_ACCELERATOR"] = "cuda"
    try:
        integration.enable()
        report = integration.accelerator_report()
        assert real_accelerator.ds_accelerator is picked and "handed" not in handover._state
        assert not report["agree"] and "DS_ACCELERATOR=cuda (set by the user" in report["how"], report
        integration.disable()
        assert real_accelerator.ds_accelerator is picked
    finally:
        del os.environ["DS_ACCELERATOR"]
        real_accelerator.ds_accelerator = None
    return report


def _host_plugin(name: str, *, dist_backend: str | None = "gloo") -> types.SimpleNamespace:
    """A backend DeepSpeed has no class for, whose devices are host memory (device type cpu)."""
    return types.SimpleNamespace(
        accelreg_backends=accelreg.hookimpl(
            lambda: [
                BackendSpec(
                    name=name,
                    priority=99,
                    is_available=lambda: True,
                    device_count=lambda: 1,
                    device_type="cpu",
                    indexed=False,
                    visible_devices_var="ACME_VISIBLE_DEVICES",
                    memory_info=lambda i: MemoryInfo(free=3 * GiB, total=4 * GiB),
                    dist_backend=dist_backend,
                )
            ]
        )
    )


def check_registry_accelerator_implements_deepspeeds_interface() -> dict:
    import torch
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    from deepspeed.accelerator.real_accelerator import set_accelerator

    from accelreg.integrations.deepspeed import accelerator as ds_accelerator

    accelreg.register(_host_plugin("acme"), "fakeplugin_acme")
    try:
        acc = integration.registry_accelerator("acme")
        assert isinstance(acc, DeepSpeedAccelerator) and not type(acc).__abstractmethods__
        set_accelerator(acc)  # DeepSpeed's own validation accepts it
        assert (
            acc.device_name() == "cpu" and acc.device_name(0) == "cpu" and acc.current_device_name() == "cpu"
        )
        assert acc.device_count() == 1 and acc.is_available() and acc.current_device() == 0
        assert acc.communication_backend_name() == "gloo"
        assert acc.total_memory() == 4 * GiB and acc.available_memory(0) == 3 * GiB  # the plugin's figures
        assert acc.visible_devices_envs() == ["ACME_VISIBLE_DEVICES"]
        env: dict[str, str] = {}
        acc.set_visible_devices_envs(env, [2, 0])
        assert env == {"ACME_VISIBLE_DEVICES": "2,0"}
        t = acc.FloatTensor([1.0, 2.0])
        assert t.dtype == torch.float32 and t.device.type == "cpu" and acc.on_accelerator(t)
        acc.manual_seed(7)
        state = acc.get_rng_state()
        first = torch.rand(1)
        acc.set_rng_state(state)
        assert torch.equal(first, torch.rand(1)), "RNG falls back to the host generator"
        assert acc.default_generator(0) is torch.default_generator
        acc.synchronize()
        with acc.stream(acc.current_stream()):
            pass
        assert acc.memory_allocated() >= 0 and isinstance(acc.memory_stats(), dict)
        try:
            acc.device(3)
        except accelreg.DeviceError as exc:
            out_of_range = str(exc)
        else:
            raise AssertionError("device(3) on a 1-device backend did not raise")
        assert "acme device index 3 is out of range" in out_of_range, out_of_range
        builder = acc.create_op_builder("FusedAdamBuilder")
        assert builder is not None and not builder.is_compatible()
        try:
            builder.load()
        except NotImplementedError as exc:
            no_kernel = str(exc)
        else:
            raise AssertionError("a missing kernel loaded")
        assert "DeepSpeed has no FusedAdamBuilder kernel for the acme backend" in no_kernel, no_kernel
        # the integration's choice for the same backend: DeepSpeed's own class for its device type
        assert type(ds_accelerator.accelerator_for("acme")).__name__ == "CPU_Accelerator"
        report = dict(name=acc.device_name(), total=acc.total_memory(), no_kernel=no_kernel)
    finally:
        from deepspeed.accelerator import real_accelerator

        real_accelerator.ds_accelerator = None
        accelreg.reset()
    return report


def check_older_and_newer_interfaces() -> dict:
    """DeepSpeed < 0.18 declares ``amp``/``pin_memory``/``is_pinned`` abstract; a future release
    may add an abstract method accelreg lacks: that must fail loudly, naming it."""
    from deepspeed.accelerator import abstract_accelerator

    from accelreg.integrations.deepspeed import accelerator as ds_accelerator

    real_base = abstract_accelerator.DeepSpeedAccelerator

    class Older(real_base):  # type: ignore[misc, valid-type]
        @abc.abstractmethod
        def amp(self): ...

        @abc.abstractmethod
        def pin_memory(self, tensor, align_bytes=1): ...

        @abc.abstractmethod
        def is_pinned(self, tensor): ...

    class Newer(real_base):  # type: ignore[misc, valid-type]
        @abc.abstractmethod
        def brand_new_capability(self): ...

    import torch

    accelreg.register(_host_plugin("acme"), "fakeplugin_acme")
    try:
        abstract_accelerator.DeepSpeedAccelerator = Older
        old = ds_accelerator.registry_accelerator("acme")
        assert isinstance(old, Older) and old.amp() is torch.cpu.amp
        t = torch.ones(2)
        assert old.is_pinned(t) is False
        abstract_accelerator.DeepSpeedAccelerator = Newer
        try:
            ds_accelerator.registry_accelerator_class()
        except accelreg.IntegrationError as exc:
            message = str(exc)
        else:
            raise AssertionError("a new abstract method went unnoticed")
        assert "brand_new_capability" in message, message
    finally:
        abstract_accelerator.DeepSpeedAccelerator = real_base
        accelreg.reset()
    return {"newer": message}


def check_unavailable_backend_is_refused() -> dict:
    from accelreg.integrations.deepspeed import accelerator as ds_accelerator

    try:
        ds_accelerator.accelerator_for("npu")
    except accelreg.DeviceError as exc:
        message = str(exc)
    else:
        raise AssertionError("an unavailable backend got an accelerator")
    assert message.startswith("npu is not available"), message
    return {"message": message}


def main() -> int:
    H.quiet()
    for name, fn in list(globals().items()):
        if name.startswith("check_") and callable(fn):
            try:
                H.emit({"check": name, "ok": True, "value": fn()})
            except BaseException as exc:  # noqa: BLE001 - every outcome is reported
                H.emit(
                    {"check": name, "ok": False, "error": "".join(traceback.format_exception(exc))[-4000:]}
                )
    H.emit({"kind": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
