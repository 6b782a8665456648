"""The command's exit codes (stable, for scripts)."""

from __future__ import annotations

__all__ = [
    "EXIT_CANNOT_EXECUTE",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
]

#: Success.
EXIT_OK = 0
#: The request failed: ``resolve`` found no such device, ``plan`` found no fit.
EXIT_FAILED = 1
#: A usage error (bad arguments).
EXIT_USAGE = 2
#: A configuration or plugin error (a malformed setting; any failure in strict mode).
EXIT_CONFIG = 3
#: ``accelreg run``: the command was found but cannot be executed (no execute bit, a directory,
#: no ``#!`` line), as a shell says it.
EXIT_CANNOT_EXECUTE = 126
#: ``accelreg run``: the command, or the ``#!`` interpreter it names, was not found, as a shell
#: says it.
EXIT_NOT_FOUND = 127
#: A reader closed the output pipe early (``accelreg env | head``): the status of a process
#: killed by SIGPIPE, without a traceback.
EXIT_PIPE = 141
