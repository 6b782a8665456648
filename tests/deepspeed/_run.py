"""Entry point of the DeepSpeed helper processes: many configurations in one interpreter.

    python _run.py --accelreg install|deepspeed|none --model DIR --out DIR \
        [--trainer control 0 1 2 3] [--roundtrip BITS:STAGE:EF:STRICT ...] [--accelerator]

Imports (~10 s) dominate a run, so one process runs every configuration it is given, in order
(ZeRO-3 last: it leaves transformers' global ZeRO-3 flag set). Each prints one result line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelreg", choices=["install", "deepspeed", "none"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trainer", nargs="*", default=[])
    ap.add_argument("--roundtrip", nargs="*", default=[])
    a = ap.parse_args()
    H.quiet()
    t = time.time()
    H.use_accelreg(a.accelreg)
    H.skip_shm_op()
    H.pin_bnb()
    import peft  # noqa: F401 - import time is reported on its own
    import transformers  # noqa: F401
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    H.emit({"kind": "setup", "t_import": round(time.time() - t, 2)})
    H.make_tiny_llama(a.model)
    tasks: list[tuple[str, tuple[int, ...]]] = []
    for item in a.trainer:
        tasks.append(("trainer", () if item == "control" else (int(item),)))
    for item in a.roundtrip:
        bits, stage, ef, strict = (int(x) for x in item.split(":"))
        tasks.append(("roundtrip", (bits, stage, ef, strict)))
    tasks.sort(key=lambda t: len(t[1]) > 0 and (t[1][0] if t[0] == "trainer" else t[1][1]) == 3)
    for kind, args in tasks:
        key = {"kind": kind, "args": list(args), "mode": a.accelreg}
        try:
            if kind == "trainer":
                import _seed_trainer

                record = _seed_trainer.run(a.accelreg, args[0] if args else None, a.model, a.out, 6)
            else:
                import _roundtrip

                bits, stage, ef, strict = args
                record = _roundtrip.run_case(a.accelreg, bits, stage, bool(ef), bool(strict), a.model, a.out)
            H.emit({**key, **record})
        except Exception as exc:  # noqa: BLE001 - report, then the next configuration
            H.emit({**key, "ok": False, "load": "harness error", "harness_error": True, **H.failure(exc)})
    H.emit({"kind": "done", "mode": a.accelreg, "accelreg_imported": "accelreg" in sys.modules})
    return 0


if __name__ == "__main__":
    sys.exit(main())
