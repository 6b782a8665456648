"""A release a user can install and trust (issue 31): one version everywhere, the license in the
repository and both distributions, README links that work on a package index, the schemas in
the wheel, and an sdist whose tests run after unpacking. (.ci/run also installs the wheel into a
fresh virtual environment and runs ``accelreg env`` and ``accelreg plan`` there.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import accelreg
from accelreg.testing import clean_environ

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "plugins" / "accelreg-emu"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
EMU_PROJECT = tomllib.loads((EMU / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_one_version_everywhere():
    import accelreg_emu

    assert PROJECT["version"] == accelreg.__version__ == metadata.version("accelreg") == "0.2.0"
    assert EMU_PROJECT["version"] == accelreg_emu.__version__ == metadata.version("accelreg-emu")
    from accelreg.cli._format import version_line

    assert version_line().startswith(f"accelreg {PROJECT['version']} (torch ")


def test_the_changelog_has_a_dated_section_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]", headings[:2]
    assert re.fullmatch(rf"## \[{re.escape(PROJECT['version'])}\] - \d{{4}}-\d{{2}}-\d{{2}}", headings[1]), (
        headings[1]
    )


@pytest.mark.parametrize("where", [ROOT, EMU])
def test_the_license_file_is_the_apache_license_the_metadata_names(where):
    project = PROJECT if where == ROOT else EMU_PROJECT
    text = (where / "LICENSE").read_text(encoding="utf-8")
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert text.rstrip().endswith("limitations under the License.")


def test_readme_links_are_absolute_to_the_declared_repository():
    """A package index shows README.md without the repository around it: relative links break."""
    source = PROJECT["urls"]["Source"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", source)
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert links, "the README links to its documentation"
    relative = [link for link in links if not link.startswith(("https://", "http://", "#"))]
    assert not relative, f"relative links in README.md: {relative}"
    ours = [link for link in links if link.startswith(source)]
    for link in ours:  # each points at a file of this repository, as it is on the main branch
        path = re.sub(rf"^{re.escape(source)}/(blob|tree)/main/", "", link).split("#", 1)[0]
        assert (ROOT / path).exists(), link


def test_the_emulator_declares_what_it_needs_at_first_use():
    """It compiles its extension on first use: torch.utils.cpp_extension imports setuptools and
    builds with ninja."""
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in EMU_PROJECT["dependencies"]}
    assert {"torch", "pluggy", "ninja", "setuptools"} <= names


# -- the distributions ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The wheel and the sdist, built from this checkout as ``python -m build`` builds them
    (without isolation: the build requirements are installed here, nothing is downloaded)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        cwd=out,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for leftover in ("accelreg.egg-info", "build"):  # setuptools writes these into the checkout
        subprocess.run(["rm", "-rf", str(ROOT / leftover)], check=False)
    (wheel,) = out.glob("accelreg-*.whl")
    (sdist,) = out.glob("accelreg-*.tar.gz")
    return wheel, sdist


@pytest.mark.slow
def test_the_wheel_carries_the_license_schemas_and_startup_hook(dists):
    wheel, _ = dists
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"accelreg-{PROJECT['version']}.dist-info"
    schemas = {f"accelreg/schemas/{p.name}" for p in (ROOT / "accelreg" / "schemas").glob("*.json")}
    assert len(schemas) >= 4 and schemas <= names
    assert {f"{info}/licenses/LICENSE", "accelreg-startup.pth", "accelreg/py.typed"} <= names
    assert not [n for n in names if n.startswith("tests/")]


#: What the unpacked sdist runs: the core (resolution, configuration, sizes, the registry's
#: guards), the command's errors and the hardware report, the schemas, the architecture and the
#: executed documentation of one page (its slow tests left out). Not the emulator, DeepSpeed, Ray
#: or Lightning runs: those need the plugin built and minutes, and run from the checkout in CI.
SDIST_TESTS = [
    "tests/test_sizes.py",
    "tests/test_resolve.py",
    "tests/test_config.py",
    "tests/test_hardware.py",
    "tests/test_cli_errors.py",
    "tests/test_schemas.py",
    "tests/test_architecture.py",
    "tests/test_docs.py",
]


@pytest.mark.slow
def test_the_sdists_tests_run_after_unpacking(dists, tmp_path):
    _, sdist = dists
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    unpacked = tmp_path / f"accelreg-{PROJECT['version']}"
    for needed in ("LICENSE", "tests/conftest.py", "tests/_fakes.py", "tests/data", "docs/configuration.md"):
        assert (unpacked / needed).exists(), f"the sdist lacks {needed}"
    env = clean_environ({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [sys.executable, "-c", "import accelreg; print(accelreg.__file__)"],
        capture_output=True, text=True, cwd=unpacked, env=env, check=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(unpacked)), (
        "the unpacked sources are tested, not the checkout's"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *SDIST_TESTS, "-k", "not test_block or configuration",
         "-m", "not slow", "-q", "-n", "0", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=unpacked, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.search(r"\b\d{3,} passed\b", proc.stdout), proc.stdout[-2000:]
