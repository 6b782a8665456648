"""Testing with accelreg: the pytest plugin, child interpreters, and the conformance kit.

* :mod:`.pytest_plugin` — the ``accelreg_fresh`` and ``emu_python`` fixtures and the
  ``accelreg_emu`` marker (marked tests run in a child pytest with the emulated accelerator);
  this package is the ``pytest11`` entry point and re-exports its hooks and fixtures.
* :mod:`.child` — :func:`run_python`: code in a fresh interpreter, emulator set up or not.
* :mod:`.environ` — :func:`clean_environ` / :func:`emu_environ`: environments without the
  registry's variables, or with an emulated accelerator.
* :mod:`.conformance` — :class:`BackendConformance`, the suite a vendor points at its plugin.
"""

from __future__ import annotations

from .child import PythonResult, run_python
from .conformance import BackendConformance
from .environ import CHILD_VAR, clean_environ, emu_environ
from .pytest_plugin import accelreg_fresh, emu_python, pytest_collection_modifyitems, pytest_configure

__all__ = [
    "CHILD_VAR",
    "BackendConformance",
    "PythonResult",
    "accelreg_fresh",
    "clean_environ",
    "emu_environ",
    "emu_python",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "run_python",
]
