"""Tests of the emulated accelerator (plugins/accelreg-emu)."""
