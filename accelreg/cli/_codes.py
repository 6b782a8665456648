"""The command's exit codes (stable, for scripts)."""

from __future__ import annotations

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_PIPE", "EXIT_USAGE"]

#: Success.
EXIT_OK = 0
#: The request failed: ``resolve`` found no such device, ``plan`` found no fit.
EXIT_FAILED = 1
#: A usage error (bad arguments).
EXIT_USAGE = 2
#: A configuration or plugin error (a malformed setting; any failure in strict mode).
EXIT_CONFIG = 3
#: A reader closed the output pipe early (``accelreg env | head``): the status of a process
#: killed by SIGPIPE, without a traceback.
EXIT_PIPE = 141
