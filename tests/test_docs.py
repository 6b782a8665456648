"""Every code block in README.md and docs/*.md runs, so the docs cannot drift from the code.

* ``python`` blocks run in a fresh interpreter, in order, one interpreter per document (a later
  block sees what an earlier one defined, as a reader following the page would);
* ``bash``/``sh``/``shell`` blocks run through ``bash -eo pipefail``; ``console`` blocks run their
  ``$ `` lines (the rest is sample output);
* ``toml`` and ``json`` blocks must parse;
* blocks without a language, and ``text``, are output and are not run.

An HTML comment on the line before a block changes what happens to it:

* ``<!-- docs-test: emu NAME N -->`` — run under the emulated accelerator presenting itself as
  ``NAME`` with ``N`` devices (a block that needs an accelerator);
* ``<!-- docs-test: skip (reason) -->`` — not run; the reason is required and is the skip's
  reason (a fragment, a command that installs packages or takes minutes, ...).

Commands run in an empty temporary folder with a clean environment (no ``ACCELREG_*``
settings, no hub access: ``HF_HUB_OFFLINE=1``) and this interpreter's ``bin`` first on
``PATH``. The blocks of all documents run two at a time, once per session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelreg.testing import clean_environ, emu_environ

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((?P<reason>.*\S.*)\)$")
_EMU = re.compile(r"^emu\s+(?P<name>[a-z][a-z0-9_]*)\s+(?P<devices>[0-9]+)$")
PYTHON, SHELL, CONSOLE, DATA = ("python", "py"), ("bash", "sh", "shell"), ("console",), ("toml", "json")
_MARKER = "@@accelreg-docs-results@@"
_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    """One fenced code block and what to do with it."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    skip: str | None = None
    emu: tuple[str, int] | None = None

    @property
    def id(self) -> str:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{where}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.skip is None and self.lang in PYTHON + SHELL + CONSOLE


class DirectiveError(ValueError):
    """A ``docs-test`` comment that says nothing the collector understands."""


def parse_directive(body: str) -> dict[str, object]:
    """``"skip (why)"`` -> ``{"skip": "why"}``; ``"emu npu 2"`` -> ``{"emu": ("npu", 2)}``."""
    if m := _SKIP.match(body):
        return {"skip": m.group("reason").strip()}
    if m := _EMU.match(body):
        return {"emu": (m.group("name"), int(m.group("devices")))}
    raise DirectiveError(
        f"docs-test: {body!r} is neither 'skip (reason)' (the reason is required) nor 'emu NAME N'"
    )


def blocks_of(path: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a Markdown document, with their directives."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and set(lines[j].strip()) == {fence[0]}
        ):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        options: dict[str, object] = {}
        if k >= 0 and (d := _DIRECTIVE.match(lines[k])):
            try:
                options = parse_directive(d.group("body"))
            except DirectiveError as exc:
                raise DirectiveError(f"{path.name}:{k + 1}: {exc}") from None
        found.append(Block(path, i + 1, lang, "\n".join(body) + "\n", **options))  # type: ignore[arg-type]
        i = j + 1
    return found


ALL_BLOCKS = [b for doc in DOCUMENTS for b in blocks_of(doc)]


# -- running ------------------------------------------------------------------------------
_DRIVER = f"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {{"__name__": "__main__"}}
results = {{}}
for block in blocks:
    try:
        exec(compile(block["source"], block["id"], "exec"), namespace)
        results[block["id"]] = None
    except BaseException:  # every outcome is reported, on its own block
        results[block["id"]] = traceback.format_exc()
sys.stdout.flush()
print({_MARKER!r} + json.dumps(results), flush=True)
"""


def _environ(block: Block) -> dict[str, str]:
    env = emu_environ(*block.emu) if block.emu else clean_environ()
    if not block.emu:
        env.pop("ACCELREG_EMU_NAME", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    env.pop("COLUMNS", None)
    return env


def _run_python(group: list[Block]) -> dict[str, str | None]:
    with tempfile.TemporaryDirectory(prefix="accelreg-docs-") as tmp:
        spec = Path(tmp) / "blocks.json"
        spec.write_text(json.dumps([{"id": b.id, "source": b.source} for b in group]), encoding="utf-8")
        work = Path(tmp) / "work"
        work.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(spec)],
            capture_output=True,
            text=True,
            env=_environ(group[0]),
            cwd=work,
            timeout=_TIMEOUT,
        )
    for line in proc.stdout.splitlines():
        if line.startswith(_MARKER):
            return json.loads(line[len(_MARKER) :])
    failure = f"the interpreter exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {b.id: failure for b in group}


def _shell_source(block: Block) -> str:
    if block.lang in CONSOLE:
        return "\n".join(line[2:] for line in block.source.splitlines() if line.startswith("$ ")) + "\n"
    return block.source


def _run_shell(block: Block) -> str | None:
    with tempfile.TemporaryDirectory(prefix="accelreg-docs-") as tmp:
        proc = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", _shell_source(block)],
            capture_output=True,
            text=True,
            env=_environ(block),
            cwd=tmp,
            timeout=_TIMEOUT,
        )
    if proc.returncode == 0:
        return None
    return f"exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


def run_all(blocks: list[Block]) -> dict[str, str | None]:
    """``{block id: None (passed) or what went wrong}`` for every block that runs."""
    jobs = []
    groups: dict[tuple[Path, tuple[str, int] | None], list[Block]] = {}
    for b in blocks:
        if not b.runs:
            continue
        if b.lang in PYTHON:
            groups.setdefault((b.path, b.emu), []).append(b)
        else:
            jobs.append((_run_shell, b))
    jobs[:0] = [(_run_python, g) for g in groups.values()]
    results: dict[str, str | None] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for job, out in zip(jobs, pool.map(lambda j: j[0](j[1]), jobs), strict=True):
            results.update(out if isinstance(out, dict) else {job[1].id: out})  # type: ignore[union-attr]
    return results


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict[str, str | None]:
    """Run the blocks of the selected tests (``-k getting`` runs only that page's)."""
    selected = [
        item.callspec.params["block"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_block" and hasattr(item, "callspec")
    ]
    return run_all(selected)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_block(block: Block, outcomes: dict[str, str | None]) -> None:
    if block.skip is not None:
        pytest.skip(f"docs-test: {block.skip}")
    if block.lang == "toml":
        tomllib.loads(block.source)
    elif block.lang == "json":
        json.loads(block.source)
    elif block.runs:
        problem = outcomes[block.id]
        assert problem is None, f"{block.id} ({block.lang}, emulator {block.emu}) failed:\n{problem}"
    else:
        assert block.lang in ("", "text"), (
            f"{block.id}: a {block.lang!r} block is neither run nor output: use python, bash, console, "
            "toml, json, text or no language"
        )


# -- the collector itself ---------------------------------------------------------------
def test_directives_are_strict():
    doc = textwrap.dedent(
        """
        <!-- docs-test: emu npu 2 -->
        ```python
        print(1)
        ```

        <!-- docs-test: skip (a fragment) -->

          ```bash
          false
          ```
        """
    )
    first, second = blocks_of(ROOT / "x.md", doc)
    assert (first.emu, first.skip, first.source) == (("npu", 2), None, "print(1)\n")
    assert (second.skip, second.lang, second.source) == ("a fragment", "bash", "false\n")
    for bad in ("skip", "skip ()", "emu npu", "run later"):
        with pytest.raises(DirectiveError):
            blocks_of(ROOT / "x.md", f"<!-- docs-test: {bad} -->\n```python\npass\n```\n")


def test_a_failing_block_fails(tmp_path):
    doc = "```python\nx = 1\n```\n\n```python\nassert x == 2, 'docs drifted'\n```\n\n```bash\nexit 3\n```\n"
    blocks = blocks_of(tmp_path / "bad.md", doc)
    outcomes = run_all(blocks)
    assert outcomes[blocks[0].id] is None
    assert "docs drifted" in outcomes[blocks[1].id]
    assert outcomes[blocks[2].id].startswith("exited 3")
