"""pytest plugin and backend conformance kit (filled in by the emulator issue)."""

from __future__ import annotations
