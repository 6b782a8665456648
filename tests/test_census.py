"""The census of device branches (issue 37): every site where a served release decides by device
type is classified, the page is what the data makes, and ``accelreg env`` names the open ones.

Reads only checked-in data (``accelreg/integrations/<library>/census_sites.json`` and
``census.toml``) and, for the releases installed here, their sources; downloads nothing.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from accelreg.integrations import census as data
from accelreg.testing import run_python

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import census  # noqa: E402 - tools/ is not a package

LIBRARIES = list(census.LIBRARIES.values())


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda lib: lib.name)
def test_every_site_of_every_served_release_is_classified(library):
    """The checked-in site list covers every minor release the integrations table serves, each of
    their sites has a class, and every rule of the table is well formed and used."""
    assert census.problems(library) == [], (
        "run `python tools/census.py check` and classify the sites it names"
    )


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda lib: lib.name)
def test_the_installed_release_has_no_site_the_table_does_not_classify(library):
    """The installed release (the dev set's) is read again wherever its sources differ from the
    release the census read (a DeepSpeed built from its sdist does)."""
    if census.installed(library) is None:
        pytest.skip(f"{library.name} is not installed here (vLLM runs in its own layer: nox -s vllm)")
    assert census.problems(library, installed_too=True) == []


def test_the_census_page_is_what_the_data_makes():
    assert census.PAGE.read_text() == census.render_page(), (
        "docs/compat/census.md is stale: run `python tools/census.py page`"
    )


# -- the check can fail -------------------------------------------------------------------------
def _fake_release(tmp_path: Path, version: str, source: str) -> Path:
    """A copy of peft's census data with one more release: a tiny package tree of ``source``."""
    lib = census.LIBRARIES["peft"]
    tree = tmp_path / "tree"
    (tree / "peft" / "tuners").mkdir(parents=True)
    (tree / "peft" / "tuners" / "fake.py").write_text(textwrap.dedent(source))
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(census.data_folder("peft") / "census.toml", folder / "census.toml")
    releases = [*census.recorded(lib), census.read(lib, version, str(tree))]
    census.write_sites(lib, releases, folder)
    return folder


def test_a_release_with_one_new_branch_fails_the_check(tmp_path):
    folder = _fake_release(
        tmp_path,
        "0.21.99",
        """
        import torch

        def place(tensor):
            if tensor.device.type == "cuda":
                return tensor.pin_memory()
            return tensor
        """,
    )
    found = census.problems(census.LIBRARIES["peft"], folder=folder)
    assert len(found) == 1, found
    assert found[0].startswith("peft 0.21.99: unclassified comparison site")
    assert "peft/tuners/fake.py:5 place: tensor.device.type == 'cuda'" in found[0]


def test_a_release_with_only_known_kinds_of_branch_passes(tmp_path):
    """The same fake release whose branch names no cuda is classified by the generic rule."""
    folder = _fake_release(
        tmp_path,
        "0.21.99",
        """
        def place(tensor):
            return tensor.float() if tensor.device.type == "mps" else tensor
        """,
    )
    assert census.problems(census.LIBRARIES["peft"], folder=folder) == []


def test_a_served_minor_release_the_census_did_not_read_fails_the_check(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(census.data_folder("peft") / "census.toml", folder / "census.toml")
    lib = census.LIBRARIES["peft"]
    census.write_sites(lib, [r for r in census.recorded(lib) if not r.version.startswith("0.19.")], folder)
    assert "peft 0.19: no release of it read (python tools/census.py scan --wheels DIR)" in census.problems(
        lib, folder=folder
    )


# -- native sites: code the scan cannot read ---------------------------------------------------------
#: The names each range of safetensors' Rust device parser takes (measured: an empty file opened
#: with safe_open(f, framework="pt", device=name) under each release 0.4.3 to 0.8.0).
SAFETENSORS_TAKES = {
    "0.4.5": {"cpu", "cuda", "mps", "npu", "xpu", "xla"},
    "0.5.3": {"cpu", "cuda", "mps", "npu", "xpu", "xla", "mlu", "hpu"},
    "0.6.2": {"cpu", "cuda", "mps", "npu", "xpu", "xla", "mlu", "hpu"},
    "0.7.0": {"cpu", "cuda", "mps", "npu", "xpu", "xla", "mlu", "hpu"},
    "0.8.0": {"cpu", "cuda", "mps", "npu", "xpu", "xla", "mlu", "hpu", "musa"},
}
SEAM = "safetensors:safetensors.safe_open"


def test_safetensors_device_list_is_a_native_site_of_every_release_read():
    """The Rust core's device list is one site per release read, answered by the seam, and the
    names it takes are the ones the release knows (for ``accelreg env``)."""
    c = data.load("safetensors")
    assert list(c.releases) == list(SAFETENSORS_TAKES)
    for version, takes in SAFETENSORS_TAKES.items():
        natives = [s for s in c.sites_in(version) if s.native]
        assert len(natives) == 1, (version, natives)
        site = natives[0]
        assert (site.file, site.function, site.kind) == (
            "safetensors/_safetensors_rust",
            "Device::extract",
            "comparison",
        )
        verdict = c.verdict(site, version)
        assert (verdict.cls, verdict.by, verdict.seam) == ("answered", "native", SEAM), verdict
        assert set(c.known(version)) == takes and "sdaa" not in site.text
    # a release not read has its range's site too (a release set's installed 0.4.3: no xla)
    (oldest,) = c.native_sites("0.4.3")
    assert "'xla" not in oldest.text and "'npu[:N]'" in oldest.text
    assert oldest.id not in {s.id for s in c.sites_in("0.4.5")}
    assert "| `==0.4.3` | `safetensors/_safetensors_rust` | `Device::extract` |" in census.PAGE.read_text()
    report = {i["library"]: i for i in data.report({"safetensors": "0.8.0"}, "musa")}
    assert report["safetensors"]["known"] is True
    report = {i["library"]: i for i in data.report({"safetensors": "0.7.0"}, "musa")}
    assert report["safetensors"]["known"] is False and report["safetensors"]["open"] == 0


def test_the_installed_safetensors_takes_exactly_the_names_its_native_site_declares():
    """The declared list is the release's: the installed release (each release set's) opens an
    empty file with every device name the census knows, in a child without accelreg."""
    lib = census.LIBRARIES["safetensors"]
    here = census.installed(lib)
    if here is None:
        pytest.skip("safetensors is not installed here")
    names = sorted(census.DEVICE_TYPES | {"emu", "meta"})
    code = textwrap.dedent(
        f"""
        import json, os, struct, tempfile
        from safetensors import safe_open
        path = os.path.join(tempfile.mkdtemp(), "empty.safetensors")
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", 8) + b"{{}}      ")
        takes = []
        for name in {names!r}:
            try:
                with safe_open(path, framework="pt", device=name):
                    takes.append(name)
            except Exception:
                pass
        print(json.dumps(takes))
        """
    )
    takes = json.loads(run_python(code, name=None).stdout.strip().splitlines()[-1])
    (native,) = data.load("safetensors").natives_of(here[0])
    assert sorted(takes) == sorted(native["devices"]), (here[0], native["releases"])


def _safetensors_with(tmp_path: Path, extra: str) -> Path:
    """A copy of safetensors' census data whose census.toml ends with ``extra``."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(census.data_folder("safetensors") / "census_sites.json", folder / "census_sites.json")
    toml = (census.data_folder("safetensors") / "census.toml").read_text()
    (folder / "census.toml").write_text(toml + textwrap.dedent(extra))
    return folder


NATIVE = """
    [[native]]
    file = "safetensors/_safetensors_rust"
    function = "Storage::pin"
    kind = "comparison"
    releases = ">=0.7,<0.9"
    text = "device == {name!r} (a pinned copy)"
    devices = [{name!r}]
    """


def test_an_unclassified_native_site_fails_the_check(tmp_path):
    folder = _safetensors_with(tmp_path, NATIVE.format(name="cuda"))
    found = census.problems(census.LIBRARIES["safetensors"], folder=folder)
    assert [f.split(": unclassified")[0] for f in found] == ["safetensors 0.7.0", "safetensors 0.8.0"], found
    assert (
        "comparison site" in found[0]
        and "in safetensors/_safetensors_rust (native) Storage::pin:" in found[0]
    )


def test_a_native_site_is_classified_by_the_rules_as_any_site_is(tmp_path):
    """Without a class of its own, the generic rule (names no cuda) classifies it."""
    folder = _safetensors_with(tmp_path, NATIVE.format(name="mps"))
    assert census.problems(census.LIBRARIES["safetensors"], folder=folder) == []


def test_a_malformed_native_entry_is_named(tmp_path):
    """A kind the scanner has not, devices its text does not name, and a seam that patches nothing
    in a release the site is in."""
    answered = 'class = "answered"\nseam = "safetensors:safetensors._safe_open_handle"\nwhy = "the seam"\n'
    bad = textwrap.dedent(NATIVE.format(name="cuda")).replace('"comparison"', '"guess"')
    bad = bad.replace("devices = ['cuda']", "devices = ['cuda', 'npu']") + answered
    bad += textwrap.dedent(NATIVE.format(name="mps")).replace(">=0.7,<0.9", ">=0.4.5,<0.5") + answered
    found = census.problems(census.LIBRARIES["safetensors"], folder=_safetensors_with(tmp_path, bad))
    assert len(found) == 3, found
    assert "census.toml native 6: kind 'guess' is not one of availability, device_module" in found[0]
    assert found[1].endswith("native 6: devices ['cuda', 'npu'] are not the names its text names (['cuda'])")
    assert found[2].startswith("safetensors 0.4.5: native site ")
    assert found[2].endswith(
        "(Storage::pin) is answered by safetensors:safetensors._safe_open_handle, which patches nothing in 0.4.5"
    )


# -- the scanner ----------------------------------------------------------------------------------
def _sites(tmp_path: Path, source: str) -> list[census.Site]:
    (tmp_path / "peft").mkdir(exist_ok=True)
    (tmp_path / "peft" / "mod.py").write_text(textwrap.dedent(source))
    return census.sites_of(census.LIBRARIES["peft"], str(tmp_path))


SOURCE = """
    import torch

    def pick(device, x):
        if is_torch_npu_available():
            torch.npu.empty_cache()
        elif device.type in ("xpu", "hpu"):
            pass
        else:
            x = x.to("cuda:0")
        backends = {"cuda": "nccl", "npu": "hccl"}
        torch.cuda.synchronize()  # unconditional: CUDA-only code, not a decision
        return torch.device("cpu") if str(device).startswith("mps") else backends
    """


def test_the_scanner_reads_each_kind_of_site(tmp_path):
    found = {(s.kind, s.text) for s in _sites(tmp_path, SOURCE)}
    assert found == {
        ("availability", "is_torch_npu_available()"),
        ("device_module", "torch.npu.empty_cache()"),
        ("comparison", "device.type in ('xpu', 'hpu')"),
        ("cuda_default", "'cuda:0'"),
        ("device_dict", "{cuda, npu}"),
        ("comparison", "str(device).startswith('mps')"),
    }


def test_a_site_keeps_its_identity_when_its_lines_move(tmp_path):
    before = {s.key("peft"): s.line for s in _sites(tmp_path, SOURCE)}
    moved = SOURCE.replace("    def pick", "    # a comment\n\n    X = 1\n\n    def pick")
    after = {s.key("peft"): s.line for s in _sites(tmp_path, moved)}
    assert set(after) == set(before) and all(after[k] == before[k] + 4 for k in before)


def test_the_classification_table_names_only_real_seams():
    """An answered site names a seam of the integrations table (``<integration>:<module>.<name>``)
    or an answerer its table describes; the checks above fail on any other name."""
    for name in data.LIBRARIES:
        c = data.load(name)
        names = {label for label, *_ in c.seams} | set(c.answerers)
        for version in c.releases:
            for site in c.sites_in(version):
                verdict = c.verdict(site, version)
                if verdict is not None and verdict.cls == "answered":
                    assert verdict.seam in names, (name, version, site)


# -- accelreg env ---------------------------------------------------------------------------------
VERSIONS = {"transformers": "5.25.0", "accelerate": "1.16.0", "peft": "0.21.2", "deepspeed": None,
            "lightning": None, "vllm": None}  # fmt: skip


def test_the_report_names_what_a_device_type_no_library_knows_meets():
    items = {i["library"]: i for i in data.report(VERSIONS, "emu")}
    assert set(items) == {"transformers", "accelerate", "peft"}
    trainer = items["transformers"]
    assert (
        trainer["known"] is False
        and trainer["open"] > 0
        and trainer["page"].endswith("census.md#transformers")
    )
    assert len(trainer["sites"]) == 2 and trainer["sites"][0]["path"] == "Trainer"
    assert {s["function"] for s in trainer["sites"]} <= {
        s.function for s, _ in data.load("transformers").open_sites("5.25.0")
    }


def test_the_report_says_when_the_library_knows_the_device_type_or_the_release_is_not_read():
    items = {i["library"]: i for i in data.report({**VERSIONS, "peft": "0.99.0"}, "npu")}
    assert (
        items["transformers"]["known"] is True and items["transformers"]["state"] == "knows the device type"
    )
    assert items["peft"]["state"] == "not in the census" and items["peft"]["open"] is None


def test_accelreg_env_report_names_the_open_sites_without_importing_a_host_library():
    code = textwrap.dedent(
        """
        import sys
        from accelreg.cli.env import env_report, markdown_report
        print(markdown_report(env_report()))
        hosts = ("transformers", "accelerate", "peft", "deepspeed", "lightning")
        print("IMPORTED", [m for m in hosts if m in sys.modules])
        """
    )
    text = run_python(code, name="emu", devices=1).stdout
    assert "IMPORTED []" in text
    assert "**Device branches** for emu: open sites" in text
    assert f"- the census: {data.PAGE}" in text
    assert "- transformers 5.25.0: " in text and " open sites in " in text


def test_the_data_files_are_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert '"integrations/*/census.toml", "integrations/*/census_sites.json"' in pyproject
    assert "recursive-include accelreg/integrations census.toml census_sites.json" in manifest
    for name in data.LIBRARIES:
        assert json.loads((census.data_folder(name) / "census_sites.json").read_text())["library"] == name
