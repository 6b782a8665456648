"""Run test code in a fresh interpreter with a chosen emulated backend.

PrivateUse1 can be renamed once per process, so every backend name needs its own
process. To keep the number of processes (and interpreter start-ups) small, a *check
script* defines many ``check_<name>()`` functions; :func:`run_checks` runs them all in
one subprocess and returns each one's outcome, and the test module turns each outcome into
its own test (see :func:`check_names`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping

__all__ = ["EMU_VARS", "check_names", "emu_env", "run_checks", "run_code"]

#: Variables the emulator reads; cleared from the parent environment before each run so an
#: outer setting never leaks into a test.
EMU_VARS = (
    "ACCELREG_EMU_NAME",
    "ACCELREG_EMU_DEVICES",
    "ACCELREG_EMU_MEMORY",
    "ACCELREG_EMU_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "SDAA_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES",
)

_MARKER = "@@accelreg-emu-checks@@"
_CHECK = re.compile(r"^def (check_\w+)\(\)", re.MULTILINE)

_HARNESS = f"""
import json as _json, sys as _sys, traceback as _tb
_results = {{}}
for _name, _fn in list(globals().items()):
    if _name.startswith("check_") and callable(_fn):
        try:
            _fn()
            _results[_name] = "ok"
        except BaseException:  # noqa: BLE001 - every outcome is reported
            _results[_name] = _tb.format_exc()
_sys.stdout.flush()
print({_MARKER!r} + _json.dumps(_results), flush=True)
"""


def emu_env(
    name: str | None,
    *,
    devices: int | None = None,
    memory: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The parent environment with the emulator variables set as given (and others cleared)."""
    env = {k: v for k, v in os.environ.items() if k not in EMU_VARS}
    if name is not None:
        env["ACCELREG_EMU_NAME"] = name
    if devices is not None:
        env["ACCELREG_EMU_DEVICES"] = str(devices)
    if memory is not None:
        env["ACCELREG_EMU_MEMORY"] = memory
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra or {})
    return env


def run_code(
    code: str,
    name: str | None = "npu",
    *,
    devices: int | None = None,
    memory: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in ``python -c`` with the emulator set to ``name``.

    With ``check`` (default), a non-zero exit raises :class:`AssertionError` carrying the
    exit code, stdout and stderr.
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=emu_env(name, devices=devices, memory=memory, extra=extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess (ACCELREG_EMU_NAME={name}) exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


def check_names(script: str) -> list[str]:
    """The ``check_*`` functions a check script defines, in order."""
    return _CHECK.findall(textwrap.dedent(script))


def run_checks(script: str, name: str | None = "npu", **kwargs: object) -> dict[str, str]:
    """Run every ``check_*`` function of ``script`` in one subprocess.

    Returns ``{check name: "ok" or the formatted traceback}``. The process must also exit
    cleanly (an abort at interpreter shutdown fails every check with the process's stderr).
    """
    code = textwrap.dedent(script) + _HARNESS
    proc = run_code(code, name, check=False, **kwargs)  # type: ignore[arg-type]
    return check_results(proc, script, f"subprocess (ACCELREG_EMU_NAME={name})")


def check_results(proc: subprocess.CompletedProcess[str], script: str, who: str) -> dict[str, str]:
    """The ``{check: "ok" or traceback}`` a harnessed ``script``'s process printed; when it exited
    abnormally or printed none, every check fails with ``who``, the exit status and its output."""
    results: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(_MARKER):
            results = json.loads(line[len(_MARKER) :])
    if proc.returncode != 0 or not results:
        failure = (
            f"{who} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
        return {n: f"{results.get(n, 'not run')}\n{failure}" for n in check_names(script)}
    return results
