"""accelreg-emu's stand-in for Intel Gaudi's ``habana_frameworks`` (ACCELREG_EMU_NAME=hpu)."""
