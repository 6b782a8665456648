"""Interpreter start-up in a job: every Python process asks the registry, without user code.

``accelreg-startup.pth`` (installed at the root of site-packages with accelreg) holds one line.
In a process whose environment has neither ``ACCELREG_RUN`` (set by ``accelreg run`` for its
command) nor ``ACCELREG_AUTO_INSTALL`` (the opt-in where a job's command cannot be wrapped,
e.g. a cluster's own launch scripts) it reads those two variables and does nothing else — the
way coverage.py measures subprocesses. Otherwise it imports this module and calls :func:`arm`,
which reads them with :func:`accelreg.flags.env_switch` (``1``/``true``/``yes``/``on``; an off
word, or anything else with a one-line note, arms nothing).

Here nothing is installed yet: a watcher (:mod:`accelreg.importwatch`) waits for the first
import of a host library (a module named in the integrations table,
:func:`accelreg.integrations.table.triggers`, or its top-level package) and runs
:func:`accelreg.install` the moment that import starts, before the
library's code runs — so a launcher's own processes (DeepSpeed's runner, torchrun's agent), its
ranks, and a scheduler's workers (Ray's raylet and workers) are registry-aware, while a process
that imports none of them pays only for this module. A library that is not installed triggers
nothing (``try: import deepspeed`` / ``except ImportError`` costs no time), and ``install()``
loads no plugin: the registry is built when something first asks it.

An armed process in which accelreg cannot work — its package, pluggy or another dependency
missing or broken, a setting that does not parse, strict mode refusing an integration — stops
with one line on stderr naming what is broken and exit status :data:`EXIT_BROKEN`, before the
library it was importing runs (the ``.pth`` line does the same when this module cannot be
imported): a job never goes on without accelreg, on the cpu.
"""

from __future__ import annotations

import os
import sys

from .. import flags, importwatch
from ..integrations import install, table

TYPE_CHECKING = False  # nothing Python has not loaded at start-up (see docs/benchmarks.md)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ENV_AUTO_INSTALL", "ENV_RUN", "EXIT_BROKEN", "arm", "armed", "stop", "watched"]

#: Set by ``accelreg run`` in its command's environment (``1``).
ENV_RUN = "ACCELREG_RUN"
#: The opt-in for jobs started without ``accelreg run``: ``1``/``true``/``yes``/``on``.
ENV_AUTO_INSTALL = "ACCELREG_AUTO_INSTALL"
#: The exit status of an armed process that accelreg cannot serve (the ``accelreg`` command's
#: code for a configuration or plugin error). ``accelreg-startup.pth`` spells the same number.
EXIT_BROKEN = 3


def armed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should install accelreg's integrations at start-up: ``ACCELREG_RUN``
    or ``ACCELREG_AUTO_INSTALL`` holds an on word (:func:`accelreg.flags.env_switch`)."""
    return flags.env_switch(ENV_RUN, environ) or flags.env_switch(ENV_AUTO_INSTALL, environ)


def watched() -> tuple[str, ...]:
    """The module names whose first import runs ``install()``: every host library's trigger and
    its top-level package."""
    names: list[str] = []
    for trigger in table.triggers():
        for name in (trigger.split(".")[0], trigger):
            if name not in names:
                names.append(name)
    return tuple(names)


def arm() -> bool:
    """Run :func:`accelreg.install` when this process first imports a host library (at once if
    one already is), if :func:`armed`; returns whether it armed. Never raises: what goes wrong
    stops the process (:func:`stop`)."""
    try:
        if not armed():
            return False
        if os.environ.get("SLURM_STEP_ID"):  # a Slurm task: its allocation becomes its masks first
            from .slurm_task import pending

            if pending():
                from .slurm import apply

                apply()
        importwatch.before_first_import(watched(), _install)
    except Exception as exc:  # noqa: BLE001 - the .pth line must not raise
        stop(f"its start-up hook failed ({_one_line(exc)})")
    return True


def _install() -> None:
    try:
        # install() reads only the settings of the registry; the plugin machinery (pluggy) loads
        # at the first query. A job process checks now that it can: a missing or broken pluggy
        # stops it here, before the library's code runs, not at its first device decision.
        import pluggy  # noqa: F401

        install()
    except Exception as exc:  # noqa: BLE001 - an armed process does not go on without accelreg
        stop(f"install() failed ({_one_line(exc)})")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def stop(problem: str) -> None:
    """End this armed process now: one line on stderr saying that accelreg cannot work here
    (``problem``) and how to repair it, then exit status :data:`EXIT_BROKEN` — at once, from any
    thread, past any ``except`` in the user's code (``os._exit``, after flushing stdout and
    stderr)."""
    line = (
        f"accelreg: this job process cannot run without accelreg, and accelreg cannot work here: "
        f"{problem}. Repair the install (pip install --force-reinstall accelreg, with {ENV_RUN} "
        f"and {ENV_AUTO_INSTALL} unset), or unset them to run without accelreg\n"
    )
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is sys.stderr:
                stream.write(line)
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, or a closed one
            pass
    os._exit(EXIT_BROKEN)
