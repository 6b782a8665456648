"""DeepSpeed accelerator agreement checks, in order, in one fresh interpreter.

    python _accel_checks.py        # one result line per check_* function

The first checks run before DeepSpeed is imported (the report must not import it and must
predict DeepSpeed's choice); the later ones import DeepSpeed and switch its accelerator.
"""

from __future__ import annotations

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H

import accelreg
from accelreg.integrations import deepspeed as integration


def check_report_before_import_predicts_and_imports_nothing() -> dict:
    report = integration.accelerator_report()
    assert "deepspeed" not in sys.modules, "accelerator_report() imported deepspeed"
    assert report["deepspeed"] == "cpu" and report["accelreg"] == "cpu" and report["agree"], report
    assert report["how"].startswith("predicted"), report
    status = integration.INTEGRATION.status()
    assert "agrees with accelreg's cpu" in status["note"], status
    assert "deepspeed" not in sys.modules, "INTEGRATION.status() imported deepspeed"
    return report


def check_ds_accelerator_env_disagreement_reported_before_import() -> dict:
    os.environ["DS_ACCELERATOR"] = "cuda"
    try:
        report = integration.accelerator_report()
        note = integration.INTEGRATION.status()["note"]
    finally:
        del os.environ["DS_ACCELERATOR"]
    assert report["deepspeed"] == "cuda" and not report["agree"], report
    assert "DISAGREES with accelreg's cpu" in note and "DS_ACCELERATOR=cuda was set by the user" in note, note
    assert "deepspeed" not in sys.modules
    return {"note": note}


def check_accelreg_env_shows_the_disagreement() -> dict:
    import contextlib
    import io

    from accelreg import cli

    out = io.StringIO()
    os.environ["DS_ACCELERATOR"] = "cuda"
    try:
        with contextlib.redirect_stdout(out):
            rc = cli.main(["env"])
    finally:
        del os.environ["DS_ACCELERATOR"]
    text = out.getvalue()
    block = text[text.find("  deepspeed:") :] if "  deepspeed:" in text else ""
    line = next((x for x in block.splitlines() if "DeepSpeed accelerator" in x), "")
    assert rc == 0 and "DISAGREES with accelreg's cpu" in line, out.getvalue()
    assert "deepspeed" not in sys.modules, "accelreg env imported deepspeed"
    return {"line": line.strip()}


def check_prediction_matches_deepspeed() -> dict:
    predicted = integration._predict()
    import deepspeed  # noqa: F401 - the integration is not enabled: DeepSpeed picks by itself
    from deepspeed.accelerator import get_accelerator

    picked = get_accelerator()._name
    assert predicted == picked, (predicted, picked)
    report = integration.accelerator_report()
    assert report["how"] == "chosen by DeepSpeed" and report["agree"], report
    return {"predicted": predicted, "picked": picked}


def check_enable_when_agreeing_changes_nothing() -> dict:
    from deepspeed.accelerator import real_accelerator

    before = real_accelerator.ds_accelerator
    integration.enable()
    try:
        assert real_accelerator.ds_accelerator is before
        assert "DS_ACCELERATOR" not in os.environ
        status = integration.INTEGRATION.status()
        assert status["enabled"] and status["accelerator"]["agree"], status
    finally:
        integration.disable()
    return {"note": status["note"]}


def check_disagreement_without_user_choice_is_reported_not_changed() -> dict:
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    cpu = real_accelerator.ds_accelerator
    cuda = CUDA_Accelerator()  # constructible without a GPU; DeepSpeed "picked" cuda
    real_accelerator.set_accelerator(cuda)
    try:
        integration.enable()
        report = integration.accelerator_report()
        assert real_accelerator.ds_accelerator is cuda, "changed without a user choice"
        assert not report["agree"] and report["priority_source"] == "default", report
        assert "no backend was chosen through accelreg" in report["action"], report
        assert "DISAGREES" in integration.INTEGRATION.status()["note"]
        integration.disable()
    finally:
        real_accelerator.set_accelerator(cpu)
    return report


def check_enable_aligns_when_priority_configured_and_disable_restores() -> dict:
    from deepspeed.accelerator import get_accelerator, real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    cpu = real_accelerator.ds_accelerator
    cuda = CUDA_Accelerator()
    real_accelerator.set_accelerator(cuda)
    accelreg.configure(priority=["cpu"])
    try:
        before = integration.accelerator_report()
        assert not before["agree"] and before["action"].startswith("enable() switches"), before
        integration.enable()
        after = integration.accelerator_report()
        assert get_accelerator()._name == "cpu" and os.environ.get("DS_ACCELERATOR") == "cpu"
        assert after["agree"] and after["how"] == "aligned by accelreg", after
        integration.disable()
        assert real_accelerator.ds_accelerator is cuda, "disable() did not put DeepSpeed's choice back"
        assert "DS_ACCELERATOR" not in os.environ
    finally:
        accelreg.reset()
        real_accelerator.set_accelerator(cpu)
    return {"before": before["summary"], "after": after["summary"]}


def check_user_ds_accelerator_wins_over_priority() -> dict:
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    cpu = real_accelerator.ds_accelerator
    cuda = CUDA_Accelerator()
    real_accelerator.set_accelerator(cuda)
    os.environ["DS_ACCELERATOR"] = "cuda"
    accelreg.configure(priority=["cpu"])
    try:
        integration.enable()
        report = integration.accelerator_report()
        assert real_accelerator.ds_accelerator is cuda and os.environ["DS_ACCELERATOR"] == "cuda"
        assert not report["agree"] and "set by the user" in report["action"], report
        integration.disable()
    finally:
        del os.environ["DS_ACCELERATOR"]
        accelreg.reset()
        real_accelerator.set_accelerator(cpu)
    return report


def check_unsupported_backend_is_reported() -> dict:
    import types

    from accelreg.types import BackendSpec

    plugin = types.SimpleNamespace(
        accelreg_backends=accelreg.hookimpl(
            lambda: [BackendSpec(name="musa", priority=99, is_available=lambda: True, device_count=lambda: 1)]
        )
    )
    accelreg.register(plugin, "fakeplugin_musa")
    accelreg.configure(priority=["musa", "cpu"])
    try:
        report = integration.accelerator_report()
        assert report["accelreg"] == "musa" and not report["agree"], report
        assert report["action"].startswith("cannot align"), report
        assert integration._wanted() is None
    finally:
        accelreg.reset()
    return report


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
