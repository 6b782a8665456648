"""Interpreter start-up in a job: every Python process asks the registry, without user code.

``accelreg-startup.pth`` (installed at the root of site-packages with accelreg) holds one line
that imports this module and calls :func:`arm` only when ``ACCELREG_RUN`` (set by ``accelreg run`` for its command) or
``ACCELREG_AUTO_INSTALL`` (``1``/``true``: the documented opt-in where a job's command cannot be
wrapped, e.g. a cluster's own launch scripts) is set — the way coverage.py measures
subprocesses. Any other Python process pays one environment lookup.

Here nothing is installed yet: a watcher waits for the first import of a host library (a
module named in :data:`accelreg.integrations.HOSTS`, or its top-level package) and runs
:func:`accelreg.install` the moment that import starts, before the library's code runs — so a
launcher's own processes (DeepSpeed's runner, torchrun's agent), its ranks, and a scheduler's
workers (Ray's raylet and workers) are registry-aware, while a process that imports none of
them pays only for this module. A failure there is a warning (``install()`` never raises into
an import); in strict mode it is raised by the next accelreg integration call.
"""

from __future__ import annotations

import os

from ..integrations import HOSTS, _postimport, install

TYPE_CHECKING = False  # nothing Python has not loaded at start-up (see docs/benchmarks.md)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ENV_AUTO_INSTALL", "ENV_RUN", "arm", "armed", "watched"]

#: Set by ``accelreg run`` in its command's environment (the value says what was asked).
ENV_RUN = "ACCELREG_RUN"
#: The opt-in for jobs started without ``accelreg run``: ``1``/``true``/``yes``/``on``.
ENV_AUTO_INSTALL = "ACCELREG_AUTO_INSTALL"
_YES = ("1", "true", "yes", "on")  # the .pth line spells the same test out


def armed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should install accelreg's integrations at start-up."""
    env = os.environ if environ is None else environ
    if env.get(ENV_RUN):
        return True
    return env.get(ENV_AUTO_INSTALL, "").strip().lower() in _YES


def watched() -> tuple[str, ...]:
    """The module names whose first import runs ``install()``: every host library's trigger and
    its top-level package."""
    names: list[str] = []
    for trigger in HOSTS.values():
        for name in (trigger.split(".")[0], trigger):
            if name not in names:
                names.append(name)
    return tuple(names)


def arm() -> bool:
    """Run :func:`accelreg.install` when this process first imports a host library (at once if
    one already is), if :func:`armed`; returns whether it armed."""
    if not armed():
        return False
    if os.environ.get("SLURM_STEP_ID"):  # a Slurm task: its allocation becomes its masks first
        from .slurm_task import pending

        if pending():
            from .slurm import apply

            apply()
    _postimport.before_first_import(watched(), install)
    return True
