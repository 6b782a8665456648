"""Run at interpreter start by ``accelreg_emu_shims.pth`` when ACCELREG_EMU_NAME is set.

Appends ``accelreg_emu/shims/<name>`` to ``sys.path`` so that the vendor stand-in package
(``torch_npu``, ``torch_mlu``, ``torch_musa``, ``torch_sdaa``, ``habana_frameworks``) is
importable in this process, and in no other. It imports nothing but ``os`` and ``sys``
(never torch): activation happens when the stand-in is imported.
"""

import os
import sys


def _install() -> None:
    name = os.environ.get("ACCELREG_EMU_NAME", "").strip().lower()
    if not name or not name.isalpha():
        return
    here = os.path.dirname(os.path.abspath(__file__))
    shims = os.path.join(here, "accelreg_emu", "shims", name)
    if os.path.isdir(shims) and shims not in sys.path:
        sys.path.append(shims)


_install()
