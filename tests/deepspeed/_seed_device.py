"""Seed 000 on an emulated accelerator *device* (driven by ``conftest.Helpers.emulated``).

    ACCELREG_EMU_NAME=npu python _seed_device.py --model DIR --out DIR --stages 2

``accelreg.install()`` as in the seed's script. First the 8-bit load the seed asks for, onto
this rank's device, on a runtime without the shallow-copy override: bitsandbytes cannot quantize
8-bit weights onto such a PrivateUse1 device (it fails inside ``Int8Params``), so the placement
rules must refuse it up front. Then the seed with
4-bit weights (which bitsandbytes runs there): LoRA, Trainer + DeepSpeed, best-checkpoint load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H


def eight_bit_refused(model_dir: str, device: str) -> dict:
    """The 8-bit load on a PrivateUse1 runtime that registers no shallow-copy override: the
    emulator with its override turned off for the attempt (``ACCELREG_EMU_SHALLOW_COPY=0`` at
    start does the same); torch_npu, torch_mlu and the emulator by default register one."""
    import torch

    import accelreg

    torch.ops.accelreg_emu.set_shallow_copy_compatible(False)
    accelreg.reset()  # the bnb plugin asks torch again when the registry is rebuilt
    try:
        H.build_peft_model(8, model_dir, device)
    except Exception as exc:  # noqa: BLE001 - the outcome is the result
        frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
        return {
            "loaded": False,
            "exc_type": type(exc).__name__,
            "exc": str(exc),
            "bitsandbytes_ran": any("bitsandbytes" in f for f in frames),
        }
    finally:
        torch.ops.accelreg_emu.set_shallow_copy_compatible(True)
        accelreg.reset()
    return {"loaded": True}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", nargs="*", type=int, default=[2])
    a = ap.parse_args()
    H.quiet()
    t = time.time()
    import accelreg

    accelreg.install()
    H.skip_shm_op()
    H.pin_bnb()
    import peft  # noqa: F401
    import transformers  # noqa: F401
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    H.emit({"kind": "setup", "t_import": round(time.time() - t, 2)})
    H.make_tiny_llama(a.model)
    H.set_ds_env(True)
    device = str(accelreg.resolve())
    H.emit({"kind": "refusal", "device": device, **eight_bit_refused(a.model, device)})
    import _seed_trainer

    for stage in a.stages:
        key = {"kind": "trainer", "args": [stage], "device": device}
        try:
            H.emit({**key, **_seed_trainer.run("install", stage, a.model, a.out, 6, bits=4, device=device)})
        except Exception as exc:  # noqa: BLE001
            H.emit({**key, "ok": False, "harness_error": True, **H.failure(exc)})
    from deepspeed.accelerator import get_accelerator

    from accelreg.integrations import deepspeed as integration

    H.emit({"kind": "done", "accelerator": integration.accelerator_report(), "ds": get_accelerator()._name})
    return 0


if __name__ == "__main__":
    sys.exit(main())
