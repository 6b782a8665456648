"""DeepSpeed through accelreg's integration: ``install()`` prepares DeepSpeed's accelerator without
importing it, and ``uninstall()`` cancels that. (DeepSpeed's runs are in tests/deepspeed.)"""

from __future__ import annotations

import textwrap

from .._support import NAMES, PREFIXES  # skips this module where a library is missing


def test_install_prepares_deepspeed_without_importing_it_and_uninstall_cancels():
    """install() registers DeepSpeed's accelerator alignment for the moment DeepSpeed's
    accelerator module is imported; it imports none of the libraries itself."""
    from accelreg.testing import run_python

    code = textwrap.dedent(
        """
        import json, sys
        import accelreg
        from accelreg import importwatch
        REAL = "deepspeed.accelerator.real_accelerator"
        names = accelreg.install()
        before = importwatch.pending(REAL)
        loaded = [m for m in LIBRARIES if m in sys.modules]
        accelreg.integrations.uninstall()
        print(json.dumps({"names": names, "pending": before, "after": importwatch.pending(REAL),
                          "loaded": loaded}))
        """
    ).replace("LIBRARIES", repr(PREFIXES))
    out = run_python(code, name=None).value
    assert out == {
        "names": list(NAMES),
        "pending": True,
        "after": False,
        "loaded": [],
    }, out
