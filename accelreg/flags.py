"""On/off words: the one parser of every yes/no value accelreg reads.

Accepted, case-insensitive and with surrounding whitespace ignored: ``1``, ``true``, ``yes``,
``on`` (on) and ``0``, ``false``, ``no``, ``off`` or empty (off). :func:`parse` answers ``None``
for anything else, and each reader decides what that means:

* a **configuration setting** (``ACCELREG_STRICT``, ``ACCELREG_CPU_FALLBACK``, a ``bool`` in
  ``accelreg.toml``, ...) refuses it: :func:`accelreg.config.parse_bool` raises ``ConfigError``;
* a **switch** read by :func:`env_switch` (``ACCELREG_RUN``, ``ACCELREG_AUTO_INSTALL``, Ray's
  ``RAY_EXPERIMENTAL_NOSET_*`` as accelreg's Ray integration reads it) counts it as off and says
  so once per process, in one line on stderr. A switch is read at interpreter start-up, where
  raising is not an option and a ``warnings`` filter must not turn it into an error.

Imported at interpreter start-up by every process of a job (``accelreg-startup.pth``): it
imports nothing Python has not loaded by then.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # nothing Python has not loaded at start-up (see docs/benchmarks.md)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "env_switch", "parse"]

#: The words that mean on.
TRUE_WORDS = ("1", "true", "yes", "on")
#: The words that mean off (the empty value among them).
FALSE_WORDS = ("0", "false", "no", "off", "")

_told: set[tuple[str, str]] = set()


def parse(text: str) -> bool | None:
    """``True`` for an on word, ``False`` for an off word (empty included), ``None`` otherwise."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def env_switch(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether environment variable ``name`` is on. Unset or an off word: off. Any other value is
    off too, and is named once per process in one line on stderr (never raised)."""
    env = os.environ if environ is None else environ
    text = env.get(name)
    if text is None:
        return False
    value = parse(text)
    if value is None:
        _tell(name, text)
        return False
    return value


def _tell(name: str, text: str) -> None:
    key = (name, text)
    if key in _told:
        return
    _told.add(key)
    stream = sys.stderr
    if stream is None:  # pythonw, a daemon with its streams closed
        return
    try:
        stream.write(
            f"accelreg: {name}={text!r} is neither on (1, true, yes, on) nor off (0, false, no, off, "
            "empty); it counts as off\n"
        )
        stream.flush()
    except (OSError, ValueError):  # a closed or broken stderr must not break start-up
        pass
