"""setuptools hook (everything else is in pyproject.toml): install ``accelreg-startup.pth``.

The ``.pth`` file goes to the root of site-packages in both a regular and an editable (PEP 660)
install: for a wheel it is copied into ``build_lib``; for an editable wheel, setuptools points
``install_lib`` at the unpacked wheel, whose files all land in site-packages. Its one line
imports :mod:`accelreg.launch.startup` only in a process whose environment has ``ACCELREG_RUN``
or ``ACCELREG_AUTO_INSTALL`` (see docs/scaling.md).
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "accelreg-startup.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        target = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(os.path.join(HERE, PTH), os.path.join(target, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
