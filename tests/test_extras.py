"""``pip install "accelreg[hf,bnb,deepspeed,ray,lightning]"`` changes none of the installed releases (issue 10).

The extras carry lower bounds only. ``pip install --dry-run --no-index --report`` resolves
accelreg's requirements against what is installed (in the matrix, the release set's layer is
first on the path, so the newest set is checked against the newest releases): with
``--no-index`` any requirement the installed releases do not satisfy is an error, and the
report must list nothing but accelreg itself. No network is needed.

A release set layered with ``--no-deps`` can lack a library's *own* dependency (one the set
does not pin and the base environment does not satisfy); pip then fails naming that library as
the one asking. That is not accelreg's requirement: the test checks that every unmet
requirement pip names comes from another library, and checks accelreg's own requirements
against the installed releases itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_installing_the_extras_changes_no_installed_release(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--report",
            str(report),
            f"{ROOT}[hf,bnb,deepspeed,ray,lightning]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        asking = set(re.findall(r"No matching distribution found for .*?\(from ([^)\[]+)", proc.stderr))
        assert asking and "accelreg" not in asking, f"pip would need other releases:\n{proc.stderr[-3000:]}"
        _check_own_requirements()
        return
    planned = {
        item["metadata"]["name"]: item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert set(planned) == {"accelreg"}, planned
    for dist in ("transformers", "accelerate", "peft", "deepspeed", "bitsandbytes", "ray", "lightning"):
        assert metadata.version(dist)  # every library of the extras is installed here


def _check_own_requirements() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("hf", "bnb", "deepspeed", "ray", "lightning"):
        for text in extras[extra]:
            req = Requirement(text)
            version = metadata.version(req.name)
            assert req.specifier.contains(version, prereleases=True), f"{text} excludes installed {version}"


def test_the_test_extra_is_the_window_the_table_serves() -> None:
    """The dev environment (``.[dev]``, which CI installs) takes each host library's newest
    release *inside* the window its integration serves: a release the table does not serve yet
    cannot land in CI unannounced, and the bound moves with the table."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement

    from accelreg.integrations import table

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    bounds = {
        Requirement(text).name: Requirement(text).specifier
        for text in extras["test"]
        if not text.startswith("accelreg")
    }
    checked = set()
    for row in table.ROWS:
        upper = re.search(r"<([0-9.]+)$", row.releases)
        if row.follower or "newest" not in row.tested or upper is None:
            continue  # torch is pinned by the set-up command; vLLM has a layer of its own
        for dist in row.distributions:
            if dist not in bounds:
                continue
            spec = bounds[dist]
            assert spec.contains(row.tested["newest"]), (dist, str(spec), row.tested["newest"])
            assert not spec.contains(upper.group(1)), (dist, str(spec), row.releases)
            checked.add(dist)
    expected = {"transformers", "accelerate", "peft", "safetensors", "deepspeed", "ray", "lightning",
                "pytorch-lightning"}  # fmt: skip
    assert checked == expected, checked
