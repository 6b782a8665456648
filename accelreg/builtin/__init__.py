"""Built-in backend plugins.

Each module here is a plugin exactly like a vendor's: it implements ``accelreg_backends`` and
is registered through the ``accelreg`` entry-point group in accelreg's own ``pyproject.toml``.
A vendor plugin that registers the same name replaces the built-in one.
"""

from __future__ import annotations

import importlib

#: Entry-point name -> module, used when accelreg runs from a source tree without being
#: installed (no entry points exist then).
BUILTIN_MODULES: dict[str, str] = {
    "cpu": "accelreg.builtin.cpu",
    "cuda": "accelreg.builtin.cuda",
    "xpu": "accelreg.builtin.xpu",
    "npu": "accelreg.builtin.npu",
    "mlu": "accelreg.builtin.mlu",
    "musa": "accelreg.builtin.musa",
    "sdaa": "accelreg.builtin.sdaa",
    "hpu": "accelreg.builtin.hpu",
    "mps": "accelreg.builtin.mps",
    "bnb": "accelreg.builtin.bnb",
}


def visible_devices_vars() -> tuple[str, ...]:
    """The visible-devices variables the built-in backends declare (no probe runs, torch is
    not imported): what a clean test environment must not inherit."""
    found: list[str] = []
    for module in BUILTIN_MODULES.values():
        hook = getattr(importlib.import_module(module), "accelreg_backends", None)
        for spec in hook() if hook is not None else ():
            if spec.visible_devices_var and spec.visible_devices_var not in found:
                found.append(spec.visible_devices_var)
    return tuple(found)
