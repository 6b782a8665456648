"""Run accelerate's and peft's own tests stock and with ``accelreg.install()``; compare.

    python tools/upstream_compare.py --out .nox-results/upstream     # nox -s upstream

The tests come from each library's sdist of the installed release (``pip download
--no-binary``). Each selected file runs twice in a fresh pytest, once stock and once with a
one-line plugin that calls ``accelreg.install()`` first, both under the same environment
(peft's under the emulated two-device npu, where its ``infer_device`` differs from the CPU's). Test ids and outcomes are compared;
the run fails on any test that passes stock and fails installed, and writes
``<out>/upstream.json`` (and a Markdown summary on stdout).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

#: (distribution, test files, emulated backend or None). CPU-runnable files whose subjects the
#: integrations touch: device maps and memory (accelerate, on the CPU as its CI runs them),
#: adapter placement and initialisation (peft, under the emulated two-device npu, where
#: ``infer_device`` matters). Files needing diffusers, or importing their helpers relatively,
#: are left out: they do not collect from an unpacked sdist here. Tried for peft 0.21.2 (the
#: files that move their model to ``infer_device()``): test_custom_models.py and the others
#: importing ``.testing_utils`` fail collection ("attempted relative import with no known parent
#: package"; that module also needs ``datasets``); test_boft.py, test_supertuning.py and
#: test_multitask_prompt_tuning.py collect but load hub models, so 17 of their 19 tests fail
#: stock as well with no hub access.
SUITES: list[tuple[str, list[str], str | None]] = [
    (
        "accelerate",
        ["tests/test_modeling_utils.py", "tests/test_big_modeling.py", "tests/test_memory_utils.py"],
        None,
    ),
    ("peft", ["tests/test_mixed.py"], "npu"),
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


def _run(
    src: Path,
    files: list[str],
    emulate: str | None,
    junit: Path,
    plugin_dir: Path | None,
    env: dict[str, str],
) -> None:
    env = dict(env)
    if emulate:
        env.update(ACCELREG_EMU_NAME=emulate, ACCELREG_EMU_DEVICES="2")
    args = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if plugin_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), env.get("PYTHONPATH")]))
        args += ["-p", "_accelreg_install_first"]
    subprocess.run(args, cwd=src, env=env, timeout=3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".nox-results/upstream")
    parser.add_argument("--only", default=None, help="run one library's suite (accelerate or peft)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    report: dict[str, object] = {"suites": {}}
    broken: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plugin_dir = work / "plugin"
        plugin_dir.mkdir()
        (plugin_dir / "_accelreg_install_first.py").write_text(PLUGIN)
        for dist, files, emulate in SUITES:
            if args.only and dist != args.only:
                continue
            src = _sdist_tests(dist, work)
            stock_xml, ours_xml = out / f"{dist}-stock.xml", out / f"{dist}-installed.xml"
            _run(src, files, emulate, stock_xml, None, env)
            _run(src, files, emulate, ours_xml, plugin_dir, env)
            stock, ours = _outcomes(stock_xml), _outcomes(ours_xml)
            regressions = sorted(t for t, o in stock.items() if o == "passed" and ours.get(t) != "passed")
            fixed = sorted(
                t for t, o in ours.items() if o == "passed" and stock.get(t) not in (None, "passed")
            )
            only = sorted(set(stock) ^ set(ours))
            count = {k: sum(1 for o in stock.values() if o == k) for k in ("passed", "failed", "skipped")}
            report["suites"][dist] = {  # type: ignore[index]
                "version": metadata.version(dist),
                "files": files,
                "emulated": emulate,
                "stock": count,
                "installed": {
                    k: sum(1 for o in ours.values() if o == k) for k in ("passed", "failed", "skipped")
                },
                "passes_stock_fails_installed": regressions,
                "fails_stock_passes_installed": fixed,
                "ids_in_one_run_only": only,
            }
            broken += [f"{dist}: {t}" for t in regressions]
            if not stock or count["passed"] == 0:
                broken.append(
                    f"{dist}: the stock run collected or passed nothing (missing test dependencies?)"
                )
    (out / "upstream.json").write_text(json.dumps(report, indent=1) + "\n")
    # docs/compat/upstream.json keeps the latest result per library for docs/compatibility.md
    record = Path(__file__).resolve().parents[1] / "docs" / "compat" / "upstream.json"
    merged = json.loads(record.read_text()) if record.exists() else {"suites": {}}
    for dist, item in report["suites"].items():  # type: ignore[union-attr]
        merged["suites"][dist] = {
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
    for dist, item in report["suites"].items():  # type: ignore[union-attr]
        s, i = item["stock"], item["installed"]
        print(
            f"| {dist} {item['version']} | {', '.join(item['files'])} | {s['passed']}/{s['failed']}/{s['skipped']} "
            f"| {i['passed']}/{i['failed']}/{i['skipped']} | {len(item['passes_stock_fails_installed'])} |"
        )
    for line in broken:
        print(f"REGRESSION {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
