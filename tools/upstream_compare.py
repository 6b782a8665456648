"""Run accelerate's, peft's and Lightning's own tests stock and with ``accelreg.install()``; compare.

    python tools/upstream_compare.py --out .nox-results/upstream     # nox -s upstream
    python tools/upstream_compare.py --only lightning --src lightning=PATH-OF-A-CLONE

The tests come from each library's sdist of the installed release (``pip download
--no-binary``), or, for Lightning (whose sdist has none), from the repository at the release's
tag (GitHub's tarball, or a local clone with ``--src``). Each selected file runs twice in a fresh pytest, once stock and once with a
one-line plugin that calls ``accelreg.install()`` first, both under the same environment
(peft's under the emulated two-device npu, where its ``infer_device`` differs from the CPU's). Test ids and outcomes are compared;
the run fails on any test that passes stock and fails installed (except the changes a suite
declares as intended, each with its reason, which are recorded), and writes
``<out>/upstream.json`` (and a Markdown summary on stdout).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

_CASE = re.compile(r"-(\w+Config)-config_kwargs(\d+)\]$")


def _uses_the_hub(src: Path, files: list[str]) -> set[str]:
    """``file::Class::test`` (or ``file::test``) of every test that enters peft's
    ``hub_online_once``, in its body or through a fixture or helper of the file (one level;
    peft's ``testing_common`` helpers are not read): that context switches offline mode
    off to download a hub model, and each download then retries for about half a minute."""

    def enters(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == "hub_online_once" for n in ast.walk(node))

    found = set()
    for name in files:
        tree = ast.parse((src / name).read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        # fixtures and helpers (a fixture argument, ``self.patch_model(...)``) that enter it
        helpers = {f.name for f in functions if not f.name.startswith("test") and enters(f)}
        scopes = [(f"{name}::", tree.body)] + [
            (f"{name}::{node.name}::", node.body) for node in tree.body if isinstance(node, ast.ClassDef)
        ]
        for prefix, body in scopes:
            for node in body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                    used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                    if enters(node) or helpers & (used | {arg.arg for arg in node.args.args}):
                        found.add(prefix + node.name)
    return found


def _first_case_of_each_tuner_config(ids: list[str]) -> list[str]:
    """peft's parametrized grid, thinned: for each test method and each tuner config class
    (``LoraConfig``, ``C3AConfig``, ... 35 in peft 0.21), its first case only.
    test_custom_models.py alone collects 19,485 tests (about 40 minutes a run here); every tuner
    still runs every test method. Tests that are not of the grid are all kept."""
    first: dict[tuple[str, str], int] = {}
    for tid in ids:
        m = _CASE.search(tid)
        if m:
            key = (tid.split("[")[0], m.group(1))
            first[key] = min(first.get(key, 1 << 30), int(m.group(2)))
    keep = []
    for tid in ids:
        m = _CASE.search(tid)
        key = (tid.split("[")[0], m.group(1)) if m else None
        if m is None or first[key] == int(m.group(2)):  # type: ignore[index]
            keep.append(tid)
    return keep


#: The suites. CPU-runnable files
#: whose subjects the integrations touch: device maps and memory (accelerate, on the CPU as its CI
#: runs them), adapter placement and initialisation (peft, under the emulated two-device npu,
#: where ``infer_device`` matters: these are the files that move their models to it). peft's
#: files import their helpers relatively (``from .testing_utils import ...``): its repository has
#: ``tests/__init__.py``, its sdist does not, so the unpacked ``tests/`` gets an empty one (as
#: peft's CI has it). Their imports need ``datasets`` and ``diffusers`` (installed by the nox
#: session). Tests that load a model from the hub fail stock and installed alike (no network,
#: ``HF_HUB_OFFLINE=1``, they fail at once): they are not differences, and nothing marks them, so
#: they stay in the counts. Left out: files needing a GPU, bitsandbytes kernels or hub models for
#: most of their tests (test_boft.py, test_supertuning.py, test_multitask_prompt_tuning.py: 17 of
#: 19 fail stock), test_config.py (1294 tests of config objects, no device), and, for time,
#: test_initialization.py (409 tests; about 60 ran in 6 minutes here), test_tuners_utils.py and
#: test_helpers.py (not timed yet).
_LIGHTNING_REPO = "github:Lightning-AI/pytorch-lightning"
_LIGHTNING_FILES = [
    "tests_pytorch/accelerators",
    "tests_pytorch/trainer/connectors/test_accelerator_connector.py",
    "tests_fabric/accelerators",
    "tests_fabric/test_connector.py",
]
_AUTO = (
    "accelerator=\"auto\" (the default) is the registry's npu, where the test expects Lightning's own "
    "pick on a machine without an accelerator"
)
_MOCKED = (
    "the test mocks Lightning's own detection (a TPU, or CUDA devices) and expects auto to pick it; "
    "the registry's npu, which is real here, comes first"
)
#: What install() is meant to change in Lightning's own tests on an npu node.
_LIGHTNING_INTENDED = {
    "tests_pytorch.trainer.connectors.test_accelerator_connector::test_accelerator_cpu": _AUTO,
    "tests_pytorch.trainer.connectors.test_accelerator_connector::test_connector_auto_selection": _MOCKED,
    "tests_pytorch.trainer.connectors.test_accelerator_connector::test_accelerator_choice_tpu": _MOCKED,
    "tests_pytorch.accelerators.test_xla::test_accelerator_tpu": _MOCKED,
    "tests_fabric.test_connector::test_connector_auto_selection": _MOCKED,
    "tests_fabric.test_connector::test_accelerator_choice_tpu": _MOCKED,
    "tests_fabric.test_connector::test_xla_fsdp_automatic_strategy_selection": _MOCKED,
    "tests_fabric.accelerators.test_registry::test_available_accelerators_in_registry": (
        "the test lists the registry's names: install() adds the npu that is here"
    ),
}


@dataclass(frozen=True)
class Suite:
    """One library's files, the emulated backend they run under, and how they are run."""

    dist: str
    files: list[str]
    emulate: str | None = None
    #: thins the collected test ids (one collection, the same ids for both runs)
    select: Callable[[list[str]], list[str]] | None = None
    #: an empty ``tests/__init__.py``, which the repository has and the sdist lacks
    tests_package: bool = False
    #: where the tests come from: the release's sdist, or ``github:owner/repo`` at the release's
    #: tag (an sdist without tests; ``--src dist=PATH`` reads a local clone or folder instead)
    source: str = "sdist"
    #: the folder (in the source) pytest runs in, the files being relative to it
    cwd: str = ""
    #: emulated devices (with ``emulate``)
    devices: int = 2
    #: the key of the suite in the report (several suites of one library: ``lightning@npu``)
    label: str = ""
    #: test ids (``file::test`` prefixes) whose outcome *should* change with ``install()`` in this
    #: run, each with the reason: recorded as intended, not as regressions
    intended: dict[str, str] | None = None

    @property
    def key(self) -> str:
        return self.label or self.dist


SUITES: list[Suite] = [
    Suite(
        "accelerate",
        ["tests/test_modeling_utils.py", "tests/test_big_modeling.py", "tests/test_memory_utils.py"],
    ),
    Suite(
        "peft",
        [
            "tests/test_custom_models.py",
            "tests/test_other.py",
            "tests/test_mixed.py",
        ],
        emulate="npu",
        select=_first_case_of_each_tuner_config,
        tests_package=True,
    ),
    # Lightning's accelerator and connector tests, from the release's tag (its sdist has no tests),
    # run in the repository's tests/ folder as Lightning's CI does: on the cpu, where install()
    # must change nothing, and under one emulated npu (one device, as Lightning's cpu tests expect
    # of devices="auto"), where "auto" is meant to become the npu.
    Suite("lightning", _LIGHTNING_FILES, source=_LIGHTNING_REPO, cwd="tests"),
    Suite(
        "lightning",
        _LIGHTNING_FILES,
        source=_LIGHTNING_REPO,
        cwd="tests",
        emulate="npu",
        devices=1,
        label="lightning@npu",
        intended=_LIGHTNING_INTENDED,
    ),
]
PLUGIN = "import accelreg\n\naccelreg.install()\n"


def _sdist_tests(dist: str, work: Path) -> Path:
    version = metadata.version(dist)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{dist}=={version}",
            "-d",
            str(work),
        ],
        check=True,
    )
    archive = next(work.glob(f"{dist}-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return work / f"{dist}-{version}"


def _tag_tests(suite: Suite, work: Path, local: dict[str, str]) -> Path:
    """The ``tests/`` folder of the repository at the installed release's tag: from a local
    clone (``git archive``) or folder given with ``--src``, else GitHub's tarball of the tag."""
    import shutil
    import urllib.request

    version = metadata.version(suite.dist)
    root = work / f"{suite.dist}-{version}-src"
    if root.exists():
        return root
    root.mkdir()
    given = local.get(suite.dist)
    if given and ((Path(given) / ".git").exists() or (Path(given) / "HEAD").exists()):
        archive = subprocess.run(
            ["git", "-C", given, "archive", version, "tests"], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
    elif given:
        shutil.copytree(Path(given) / "tests", root / "tests")
    else:
        repo = suite.source.removeprefix("github:")
        url = f"https://codeload.github.com/{repo}/tar.gz/refs/tags/{version}"
        with urllib.request.urlopen(url, timeout=300) as response:
            data = response.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            top = tar.getnames()[0].split("/")[0]
            members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/tests/")]
            tar.extractall(work, members=members, filter="data")
        (work / top / "tests").rename(root / "tests")
    return root


def _intended(suite: Suite, tid: str) -> str | None:
    for prefix, why in (suite.intended or {}).items():
        if tid == prefix or tid.startswith(prefix + "["):
            return why
    return None


def _outcomes(junit: Path) -> dict[str, str]:
    if not junit.exists():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out[tid] = "failed"
        elif case.find("skipped") is not None:
            out[tid] = "skipped"
        else:
            out[tid] = "passed"
    return out


def _pytest(
    emulate: str | None, plugin_dir: Path | None, env: dict[str, str], devices: int = 2
) -> tuple[list[str], dict[str, str]]:
    """The pytest command line (without targets) and the environment of one run."""
    env = dict(env)
    if emulate:
        env.update(ACCELREG_EMU_NAME=emulate, ACCELREG_EMU_DEVICES=str(devices))
    # -o addopts=: peft's pyproject adds --cov and --durations to every run
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    if plugin_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), env.get("PYTHONPATH")]))
        args += ["-p", "_accelreg_install_first"]
    return args, env


def _collect(src: Path, suite: Suite, env: dict[str, str]) -> list[str]:
    """The test ids of the suite's files, collected stock."""
    args, env = _pytest(suite.emulate, None, env, suite.devices)
    proc = subprocess.run(
        [*args, "--collect-only", *suite.files],
        cwd=src / suite.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return [line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def _run(
    src: Path, suite: Suite, targets: list[str], junit: Path, plugin_dir: Path | None, env: dict[str, str]
) -> float:
    """One run of ``targets`` (files, or ``@file`` of test ids); its wall seconds."""
    args, env = _pytest(suite.emulate, plugin_dir, env, suite.devices)
    start = time.perf_counter()
    subprocess.run([*args, f"--junitxml={junit}", *targets], cwd=src / suite.cwd, env=env, timeout=3600)
    return round(time.perf_counter() - start, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".nox-results/upstream")
    parser.add_argument(
        "--only", default=None, help="run one library's suites (accelerate, peft, lightning, or a label)"
    )
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="DIST=PATH",
        help="a local clone (its release tag is read) or folder holding a library's tests/",
    )
    args = parser.parse_args()
    local = dict(item.split("=", 1) for item in args.src)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    # a test that turns offline mode off (peft's hub_online_once) is refused at once, not after
    # a network timeout: nothing listens on port 9 of this host
    env.update(HF_ENDPOINT="http://127.0.0.1:9")
    report: dict[str, object] = {"suites": {}}
    broken: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plugin_dir = work / "plugin"
        plugin_dir.mkdir()
        (plugin_dir / "_accelreg_install_first.py").write_text(PLUGIN)
        for suite in SUITES:
            dist, key = suite.dist, suite.key
            if args.only and args.only not in (dist, key):
                continue
            if suite.source != "sdist":
                src = _tag_tests(suite, work, local)
            else:
                src = _sdist_tests(dist, work)
            if suite.tests_package and not (src / "tests" / "__init__.py").exists():
                (src / "tests" / "__init__.py").write_text("")
            targets, collected = list(suite.files), None
            if suite.select is not None:
                ids = _collect(src, suite, env)
                hub = _uses_the_hub(src, suite.files)
                chosen = [t for t in suite.select(ids) if t.split("[")[0] not in hub]
                collected = len(ids)
                (work / f"{key}-ids.txt").write_text("\n".join(chosen) + "\n")
                targets = [f"@{work / f'{key}-ids.txt'}"]
            stock_xml, ours_xml = out / f"{key}-stock.xml", out / f"{key}-installed.xml"
            seconds = {
                "stock": _run(src, suite, targets, stock_xml, None, env),
                "installed": _run(src, suite, targets, ours_xml, plugin_dir, env),
            }
            stock, ours = _outcomes(stock_xml), _outcomes(ours_xml)
            changed = sorted(t for t, o in stock.items() if o == "passed" and ours.get(t) != "passed")
            intended = {t: why for t in changed if (why := _intended(suite, t)) is not None}
            regressions = [t for t in changed if t not in intended]
            fixed = sorted(
                t for t, o in ours.items() if o == "passed" and stock.get(t) not in (None, "passed")
            )
            only = sorted(set(stock) ^ set(ours))
            count = {k: sum(1 for o in stock.values() if o == k) for k in ("passed", "failed", "skipped")}
            report["suites"][key] = {  # type: ignore[index]
                "library": dist,
                "version": metadata.version(dist),
                "files": suite.files,
                "emulated": suite.emulate,
                "devices": suite.devices if suite.emulate else None,
                "collected": collected,
                "selection": suite.select.__name__.strip("_").replace("_", " ") if suite.select else None,
                "seconds": seconds,
                "stock": count,
                "installed": {
                    k: sum(1 for o in ours.values() if o == k) for k in ("passed", "failed", "skipped")
                },
                "passes_stock_fails_installed": regressions,
                "intended_changes": intended,
                "fails_stock_passes_installed": fixed,
                "ids_in_one_run_only": only,
            }
            broken += [f"{key}: {t}" for t in regressions]
            if not stock or count["passed"] == 0:
                broken.append(
                    f"{key}: the stock run collected or passed nothing (missing test dependencies?)"
                )
    (out / "upstream.json").write_text(json.dumps(report, indent=1) + "\n")
    # docs/compat/upstream.json keeps the latest result per library for docs/compatibility.md
    record = Path(__file__).resolve().parents[1] / "docs" / "compat" / "upstream.json"
    merged = json.loads(record.read_text()) if record.exists() else {"suites": {}}
    for key, item in report["suites"].items():  # type: ignore[union-attr]
        merged["suites"][key] = {
            **item,
            "date": datetime.date.today().isoformat(),
            "ids_in_one_run_only": len(item["ids_in_one_run_only"]),
        }
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(merged, indent=1) + "\n")
    print(
        "| library | files | stock (passed/failed/skipped) | with install() | passes stock, fails installed |"
    )
    print("| --- | --- | --- | --- | --- |")
    for key, item in report["suites"].items():  # type: ignore[union-attr]
        s, i = item["stock"], item["installed"]
        print(
            f"| {key} {item['version']} | {', '.join(item['files'])} | {s['passed']}/{s['failed']}/{s['skipped']} "
            f"| {i['passed']}/{i['failed']}/{i['skipped']} | {len(item['passes_stock_fails_installed'])} |"
        )
        for tid, why in item["intended_changes"].items():
            print(f"INTENDED {key}: {tid}: {why}")
    for line in broken:
        print(f"REGRESSION {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
