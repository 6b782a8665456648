"""Imported by submodules so that importing any of them brings up the emulator."""

from __future__ import annotations

from accelreg_emu._shim import bootstrap

bootstrap("hpu", "habana_frameworks.torch")
