"""A vendor plugin whose module imports a host library at the top loads (issue 39).

The import fires that library's integration while the registry is loading the plugin, where
asking the registry is refused: the integration waits until the registry is built, then
enables (DeepSpeed gets the registry's accelerator), with no warning; the vendor's backend is
registered. Each under ``install()`` and under ``accelreg run``, on the emulated npu.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelreg.testing import emu_environ

#: What the vendor's plugin module imports at its top, and the integration that import enables.
IMPORTS = {
    "deepspeed": ("import deepspeed", "deepspeed"),
    "transformers": ("import transformers.modeling_utils", "transformers"),
    "accelerate": ("import accelerate", "accelerate"),
}

PLUGIN = """
{imports}  # the vendor's framework glue, imported at module level
from accelreg import plugin


@plugin.hookimpl
def accelreg_backends():
    yield plugin.BackendSpec(
        name="acme",
        priority=10,
        device_type="acme",
        is_available=lambda: plugin.Availability.no("no acme card on this machine"),
        device_count=lambda: 0,
    )
"""

#: The job: what it imports (the library the plugin imports, after accelreg is armed), then what
#: it reports.
JOB = """
import json, sys, warnings
warnings.simplefilter("always")
{install}
import accelreg
{imports}
from accelreg.integrations import status
snap = accelreg.registry.get()
out = {{
    "backends": [b.name for b in accelreg.backends()],
    "failures": [str(f) for f in snap.failures],
    "resolve": str(accelreg.resolve()),
    "enabled": sorted(i["name"] for i in status() if i["enabled"]),
}}
if "deepspeed" in sys.modules:
    from accelreg.integrations.deepspeed import accelerator_report
    out["deepspeed"] = accelerator_report()["how"]
print("@@" + json.dumps(out))
"""


def _site(tmp_path: Path, library: str) -> Path:
    site = tmp_path / "site"
    info = site / "acme_vendor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-vendor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[accelreg]\nacme = acme_vendor\n")
    (site / "acme_vendor.py").write_text(PLUGIN.format(imports=IMPORTS[library][0]))
    return site


def _run(tmp_path: Path, library: str, how: str) -> tuple[dict[str, object], str]:
    site = _site(tmp_path, library)
    env = emu_environ("npu", 2)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    imports = IMPORTS[library][0]
    if how == "install()":
        code = JOB.format(install="import accelreg\naccelreg.install()", imports=imports)
        argv = [sys.executable, "-c", code]
    else:
        code = JOB.format(install="", imports=imports)
        argv = [sys.executable, "-m", "accelreg", "run", "--", sys.executable, "-c", code]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:]), proc.stderr


def _check(result: dict[str, object], stderr: str, library: str) -> None:
    assert "acme" in result["backends"], result  # the vendor's backend is registered
    assert result["failures"] == [], result["failures"]
    assert result["resolve"] == "npu:0"
    assert IMPORTS[library][1] in result["enabled"], result["enabled"]
    assert "IntegrationWarning" not in stderr, stderr
    assert "called back into accelreg" not in stderr and "could not hand DeepSpeed" not in stderr, stderr
    if library == "deepspeed":
        assert str(result["deepspeed"]).startswith("handed over by accelreg"), result["deepspeed"]


def test_a_plugin_importing_deepspeed_loads_and_deepspeed_gets_the_registrys_accelerator(
    tmp_path: Path,
) -> None:
    result, stderr = _run(tmp_path, "deepspeed", "install()")
    _check(result, stderr, "deepspeed")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("library", "how"),
    # deepspeed under install() is the default run's test above
    [
        (lib, how)
        for lib in sorted(IMPORTS)
        for how in ("install()", "accelreg run")
        if (lib, how) != ("deepspeed", "install()")
    ],
)
def test_a_plugin_importing_a_host_library_loads(tmp_path: Path, library: str, how: str) -> None:
    result, stderr = _run(tmp_path, library, how)
    _check(result, stderr, library)
