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
        # docs/compatibility.md from docs/compat/*.json

Nothing in the table is written by hand: it is regenerated from the records.
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
import tarfile
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "compat"
LIBRARIES = {  # integration -> the distribution whose wheels the survey reads
    "transformers": "transformers",
    "accelerate": "accelerate",
    "peft": "peft",
    "deepspeed": "deepspeed",
    "ray": "ray",
    "ray_train": "ray",  # Ray Train's seams: the same wheel
    "lightning": "lightning",
    "pytorch_lightning": "pytorch-lightning",
    "lightning_fabric": "pytorch-lightning",  # bundled there (alone: the lightning-fabric distribution)
    "accelerate_launch": "accelerate",  # accelerate's command line: the same wheel
    "torch_accelerator": "torch",  # torch.accelerator (its wheels are not surveyed: the base environment's)
}
OTHERS = ("bitsandbytes", "kernels", "torch", "huggingface_hub", "tokenizers", "lightning-fabric")


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
    import accelreg.integrations as integrations

    seams = {}
    releases = {}
    for name, (module, trigger) in integrations.INTEGRATIONS.items():
        integ = importlib.import_module(module).INTEGRATION
        if integ.version() is None:
            continue
        importlib.import_module(trigger)
        seams[name] = [m.as_dict() | {"reason": m.reason} for m in integ.match()]
        releases[name] = integ.version()
    out = {
        "set": args.set,
        "date": datetime.date.today().isoformat(),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in (*LIBRARIES.values(), *OTHERS)},
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


def _release_of(archive: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of a wheel or sdist file name (``None`` for anything else)."""
    m = re.match(r"([A-Za-z_]+)-(\d[^-]*?)(?:-|\.tar\.gz$)", os.path.basename(archive))
    if m is None:
        return None
    return m.group(1).lower().replace("_", "-"), m.group(2)


def survey(args: argparse.Namespace) -> None:
    from packaging.version import Version

    import accelreg.integrations as integrations

    rows = []
    for wheel in sorted(glob.glob(os.path.join(args.wheels, "*.whl"))):
        release = _release_of(wheel)
        if release is None:
            continue
        dist, version = release
        names = [n for n, d in LIBRARIES.items() if d == dist]  # a wheel may ship several packages
        if not names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            with zipfile.ZipFile(wheel) as zf:  # the survey reads sources only (Ray's wheel is 70 MB)
                zf.extractall(tmp, members=[n for n in zf.namelist() if n.endswith(".py")])
            from accelreg.integrations import _seams

            for name in names:
                integ = importlib.import_module(integrations.INTEGRATIONS[name][0]).INTEGRATION
                _seams._PARSED.clear()
                matches = integ.survey(root=tmp)
                rows.append(
                    {
                        "library": dist,
                        "integration": name,
                        "version": version,
                        "adapters": {m.seam.name: (m.adapter.name if m.adapter else None) for m in matches},
                    }
                )
    path = RECORDS / "survey.json"
    if args.merge and path.exists():  # keep the releases of wheels not in this folder
        seen = {(r.get("integration", r["library"]), r["version"]) for r in rows}
        old = json.loads(path.read_text())["releases"]
        rows += [r for r in old if (r.get("integration", r["library"]), r["version"]) not in seen]
    rows.sort(key=lambda r: (r.get("integration", r["library"]), Version(r["version"])))
    RECORDS.mkdir(parents=True, exist_ok=True)
    payload = {"date": datetime.date.today().isoformat(), "releases": rows}
    (RECORDS / "survey.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RECORDS / 'survey.json'} ({len(rows)} releases)")


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
#: (accelreg.integrations.torch_accelerator): the rest address torch's runtime's current device.
FOLLOWED = ("current_accelerator", "device_count", "is_available")


class _AcceleratorCalls(ast.NodeVisitor):
    """Every use of ``torch.accelerator`` in one module: ``torch.accelerator.<api>`` (called or
    read), the module object itself, ``from torch.accelerator import <api>``, and torch's private
    ``torch._C._accelerator_*`` bindings; each with the enclosing function."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.sites: list[tuple[str, str, int]] = []

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

    def _add(self, api: str, line: int) -> None:
        self.sites.append((".".join(self.scope) or "<module>", api, line))

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


def accelerator_sites(root: str) -> list[dict[str, object]]:
    """Every torch.accelerator use under ``root`` (unpacked sources), tests and examples left out."""
    out: list[dict[str, object]] = []
    for path in sorted(Path(root).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in ("tests", "test", "examples", "benchmarks") for p in parts) or parts[0].endswith(".data"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        visitor = _AcceleratorCalls()
        visitor.visit(tree)
        out += [{"file": rel, "function": fn, "api": api, "line": line} for fn, api, line in visitor.sites]
    return out


def _unpack_sources(archive: str, into: str) -> str:
    """The ``.py`` files of a wheel or sdist, unpacked into ``into``; returns the source root."""
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into, members=[n for n in zf.namelist() if n.endswith(".py")])
        return into
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(".py")]
        tf.extractall(into, members=members, filter="data")
    tops = [p for p in Path(into).iterdir() if p.is_dir()]
    return str(tops[0]) if len(tops) == 1 else into


def accelerator_calls(args: argparse.Namespace) -> None:
    from packaging.version import InvalidVersion, Version

    rows = []
    for archive in sorted(glob.glob(os.path.join(args.wheels, "*"))):
        release = _release_of(archive)
        if release is None or release[0] not in ACCELERATOR_CALLERS:
            continue
        dist, version = release
        try:
            Version(version)
        except InvalidVersion:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            root = _unpack_sources(archive, tmp)
            rows.append({"library": dist, "version": version, "sites": accelerator_sites(root)})
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
    return f"{adapter}" + ("" if seam.get("patched") else " (nothing to patch)")


def table(_: argparse.Namespace) -> None:
    sets = []
    for path in sorted(RECORDS.glob("*.json")):
        if path.name not in ("survey.json", "upstream.json", "accelerator_calls.json"):
            sets.append(json.loads(path.read_text()))
    order = {"oldest": 0, "middle": 1, "dev": 2, "newest": 3}
    sets.sort(key=lambda r: order.get(r["set"], 9))
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `python tools/compat.py table` from docs/compat/*.json; do not edit by hand. -->",
        "",
        "Which release of each library accelreg's integrations were run against, which adapter each",
        "seam got (chosen by the seam's shape, never by the version number), and what the tests said.",
        "A seam with no adapter is skipped alone with a warning; the library's other seams stay on.",
        "",
        "## Release sets run by `nox -s matrix` (integration, import-safety, placement and seed tests)",
        "",
        "The default `python -m pytest` runs on the **dev** set: what the README's set-up command",
        "resolves on a fresh clone. CI (`.ci/run`) also runs the **oldest** and the **newest** set.",
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
            "| library | release | seam | adapter |",
            "| --- | --- | --- | --- |",
        ]
        for name, seams in rec["seams"].items():
            release = (rec.get("releases") or {}).get(name) or v.get(LIBRARIES[name])
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
                lines.append(f"| {row['version']} | " + " | ".join(str(c) for c in cells) + " |")
            lines.append("")
    lines += _accelerator_lines()
    (ROOT / "docs" / "compatibility.md").write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {ROOT / 'docs' / 'compatibility.md'}")


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
