"""``python -m accelreg``: the same as the ``accelreg`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
