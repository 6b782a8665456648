"""Run Python code in a fresh interpreter, with or without the emulated accelerator."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .environ import clean_environ, emu_environ

__all__ = ["PythonResult", "run_python"]


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
