"""Built-in backend plugins.

Each module here is a plugin exactly like a vendor's: it implements ``accelreg_backends`` and
is registered through the ``accelreg`` entry-point group in accelreg's own ``pyproject.toml``.
A vendor plugin that registers the same name replaces the built-in one.
"""

from __future__ import annotations

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
