"""Every code block in README.md and docs/*.md runs, so the docs cannot drift from the code.

* ``python`` blocks run in a fresh interpreter, in order, one interpreter per document (a later
  block sees what an earlier one defined, as a reader following the page would);
* ``bash``/``sh``/``shell`` blocks run through ``bash -eo pipefail``; ``console`` blocks run their
  ``$ `` lines (the rest is sample output);
* ``toml`` and ``json`` blocks must parse;
* blocks without a language, and ``text``, are output and are not run.

An HTML comment on the line before a block changes what happens to it:

* ``<!-- docs-test: emu NAME N -->`` — run under the emulated accelerator presenting itself as
  ``NAME`` with ``N`` devices (a block that needs an accelerator); the text before the block
  must say how to run it there (``ACCELREG_EMU_NAME=NAME``), since it does not run as printed
  on a machine without an accelerator;
* ``<!-- docs-test: anywhere, emu NAME N -->`` — run twice: as printed without an accelerator,
  and under the emulated one (a block that works on both, such as the README's quickstart);
* ``<!-- docs-test: skip (reason) -->`` — not run; the reason is required and is the skip's
  reason (a fragment, a command that installs packages or takes minutes, ...).

A ``python`` line whose comment starts with ``# -> `` states a value, and the value is checked:
an expression (``accelreg.resolve(1)  # -> device(type='npu', index=1)``) or a simple
assignment (``x = f()  # -> 3``, checking ``x``) must have that ``repr`` or ``str``; ``...``
stands for any text, and two spaces end the value (prose may follow). A line that is not run
(an ``except`` path) states nothing. A value comment in any other form (``# "npu"``) is an
error: state it with ``# -> `` so that it is checked.

Commands run in an empty temporary folder with a clean environment (no ``ACCELREG_*``
settings, no hub access: ``HF_HUB_OFFLINE=1``) and this interpreter's ``bin`` first on
``PATH``. The blocks of all documents run two at a time, once per session.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
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
_EMU = re.compile(r"^(?P<anywhere>anywhere,\s*)?emu\s+(?P<name>[a-z][a-z0-9_]*)\s+(?P<devices>[0-9]+)$")
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
    #: Also run as printed, without an accelerator (``anywhere, emu NAME N``).
    anywhere: bool = False
    #: Set on the copy of an ``anywhere`` block that runs without the emulator.
    plain_run: bool = False

    @property
    def id(self) -> str:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{where}:{self.line}" + (" [without an accelerator]" if self.plain_run else "")

    @property
    def runs(self) -> bool:
        return self.skip is None and self.lang in PYTHON + SHELL + CONSOLE


class DirectiveError(ValueError):
    """A ``docs-test`` comment that says nothing the collector understands."""


def parse_directive(body: str) -> dict[str, object]:
    """``"skip (why)"`` -> ``{"skip": "why"}``; ``"emu npu 2"`` -> ``{"emu": ("npu", 2)}``;
    ``"anywhere, emu npu 2"`` -> the same and ``{"anywhere": True}``."""
    if m := _SKIP.match(body):
        return {"skip": m.group("reason").strip()}
    if m := _EMU.match(body):
        return {"emu": (m.group("name"), int(m.group("devices"))), "anywhere": bool(m.group("anywhere"))}
    raise DirectiveError(
        f"docs-test: {body!r} is neither 'skip (reason)' (the reason is required), 'emu NAME N' nor "
        "'anywhere, emu NAME N'"
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


# -- stated values ------------------------------------------------------------------------
_STATED = re.compile(r"#\s?->\s?(?P<value>.*?)(?:\s{2,}.*)?$")
_VALUE_LIKE = re.compile(r"""#\s*(?:["'{\[(]|-?[0-9]|True\b|False\b|None\b|device\()""")


def _comments(source: str) -> dict[int, str]:
    """``{line: comment text}`` of a Python source (1-based lines)."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]


def stated_values(source: str) -> list[tuple[ast.stmt, str]]:
    """``(statement, expected text)`` for each statement ending in a ``# -> VALUE`` comment."""
    comments = _comments(source)
    out = []
    for node in _statements(ast.parse(source)):
        comment = comments.get(node.end_lineno or 0)
        if comment is None or not comment.startswith(("# ->", "#->")):
            continue
        if not isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)):
            raise ValueError(
                f"line {node.lineno}: '# -> ' states the value of an expression or an assignment"
            )
        m = _STATED.match(comment)
        value = m.group("value").strip() if m else ""
        if not value:
            raise ValueError(f"line {node.lineno}: '# -> ' is followed by no value")
        out.append((node, value))
    return out


def unchecked_values(source: str) -> list[str]:
    """Lines whose comment states a value without ``# -> `` (so nothing checks it)."""
    comments = _comments(source)
    out = []
    for node in _statements(ast.parse(source)):
        if not isinstance(node, ast.Expr) or isinstance(node.value, ast.Constant):
            continue
        comment = comments.get(node.end_lineno or 0, "")
        if _VALUE_LIKE.match(comment):
            out.append(f"line {node.end_lineno}: {comment}")
    return out


def _col(line: str, byte_offset: int) -> int:
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace"))


def checked_source(source: str, where: str) -> str:
    """``source`` with each stated value checked by ``__docs_check__`` (same line numbers)."""
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (line index, column, text to insert)
    for node, value in stated_values(source):
        tag = f"{value!r}, {f'{where}+{node.end_lineno}'!r}"
        end = node.end_lineno - 1  # type: ignore[operator]
        if isinstance(node, ast.Expr):
            expr = node.value
            edits.append((expr.lineno - 1, _col(lines[expr.lineno - 1], expr.col_offset), "__docs_check__(("))
            edits.append((end, _col(lines[end], expr.end_col_offset or 0), f"), {tag})"))
        else:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = ast.unparse(target)
            edits.append(
                (end, _col(lines[end], node.end_col_offset or 0), f"; __docs_check__({name}, {tag})")
            )
    for index, column, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[index] = lines[index][:column] + text + lines[index][column:]
    return "".join(lines)


def docs_check(value: object, expected: str, where: str) -> object:
    """``value`` if its ``repr`` or ``str`` is ``expected`` (``...``: any text), else AssertionError."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    for shown in (repr(value), str(value)):
        if re.fullmatch(pattern, shown, re.DOTALL):
            return value
    raise AssertionError(f"{where}: the comment says -> {expected}, but the value is {value!r}")


# -- running ------------------------------------------------------------------------------
_DRIVER = f"""
import json, re, sys, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
{inspect.getsource(docs_check)}
namespace = {{"__name__": "__main__", "__docs_check__": docs_check}}
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
        blocks = [{"id": b.id, "source": checked_source(b.source, b.id)} for b in group]
        spec.write_text(json.dumps(blocks), encoding="utf-8")
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
    for b in [*blocks, *(replace(b, emu=None, plain_run=True) for b in blocks if b.anywhere)]:
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
        if block.anywhere:
            plain = replace(block, emu=None, plain_run=True)
            problem = outcomes[plain.id]
            assert problem is None, (
                f"{plain.id} ({block.lang}, as printed, no accelerator) failed:\n{problem}"
            )
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


# -- stated values and emulator instructions (issue 21) ---------------------------------------
def test_stated_values_are_checked(tmp_path):
    doc = textwrap.dedent(
        """
        ```python
        import torch
        x = 1 + 1  # -> 2
        x * 2  # -> 4  prose after two spaces
        {"a": 1, "b": [2, 3]}  # -> {'a': 1, ...}
        torch.device("cpu", 0)  # -> device(type='cpu', index=0)
        try:
            raise ValueError
            x  # -> 99
        except ValueError:
            pass
        ```

        ```python
        y = 3  # -> 4
        ```

        ```python
        str(5)  # -> '6'
        ```
        """
    )
    blocks = blocks_of(tmp_path / "values.md", doc)
    outcomes = run_all(blocks)
    assert outcomes[blocks[0].id] is None, outcomes[blocks[0].id]
    assert "the comment says -> 4, but the value is 3" in outcomes[blocks[1].id]
    assert "the comment says -> '6', but the value is '5'" in outcomes[blocks[2].id]


def test_a_value_stated_in_another_form_is_refused():
    assert unchecked_values('accelreg.resolve(1)  # "npu:1" on an Ascend node\n') == [
        'line 1: # "npu:1" on an Ascend node'
    ]
    assert unchecked_values("f()  # returns the device\nx = 1  # 1\n") == []
    with pytest.raises(ValueError, match="states the value of an expression or an assignment"):
        stated_values("import os  # -> 1\n")


def test_every_value_a_snippet_states_is_checked():
    found = [
        f"{b.id} {line}"
        for b in ALL_BLOCKS
        if b.lang in PYTHON and b.skip is None
        for line in unchecked_values(b.source)
    ]
    assert not found, "state values with '# -> ' so that the docs test checks them:\n" + "\n".join(found)


def test_an_anywhere_block_runs_twice(tmp_path):
    doc = "<!-- docs-test: anywhere, emu npu 2 -->\n```python\nimport accelreg\nprint(accelreg.resolve())\n```\n"
    (block,) = blocks_of(tmp_path / "twice.md", doc)
    assert block.anywhere and block.emu == ("npu", 2)
    outcomes = run_all([block])
    assert set(outcomes) == {block.id, block.id + " [without an accelerator]"}
    assert all(v is None for v in outcomes.values()), outcomes


def test_emulator_blocks_say_how_to_run_them():
    """A block that needs the emulator does not run as printed without an accelerator: the text
    before it (since the previous block) says how to run it there."""
    missing = []
    for doc in DOCUMENTS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        blocks = blocks_of(doc)
        for i, b in enumerate(blocks):
            if b.emu is None or b.anywhere or b.skip is not None:
                continue
            start = 0
            if i:
                start = blocks[i - 1].line + len(blocks[i - 1].source.splitlines()) + 1
            prose = "\n".join(lines[start : b.line - 1]) + "\n" + b.source
            if f"ACCELREG_EMU_NAME={b.emu[0]}" not in prose:
                missing.append(b.id)
    assert not missing, f"say how to run these on the emulator (ACCELREG_EMU_NAME=...): {missing}"


# -- the README's quickstart, run as the README says (issue 31) -------------------------------
def _quickstart() -> tuple[Block, list[str]]:
    """The README's quickstart and the output it promises: the ``text`` blocks after it (on the
    emulator, then without an accelerator)."""
    blocks = blocks_of(ROOT / "README.md")
    (i, quickstart), *_ = [(i, b) for i, b in enumerate(blocks) if b.lang in PYTHON and b.anywhere]
    printed = [b.source for b in blocks[i + 1 : i + 3] if b.lang == "text"]
    assert len(printed) == 2, "the README shows what the quickstart prints, with and without an accelerator"
    return quickstart, printed


@pytest.mark.slow
def test_the_readme_quickstart_prints_what_it_promises_as_a_script(tmp_path):
    """``ACCELREG_EMU_NAME=npu python quickstart.py`` and ``python quickstart.py``: the script as
    printed, each line of its output as the README shows it."""
    quickstart, printed = _quickstart()
    (tmp_path / "quickstart.py").write_text(quickstart.source, encoding="utf-8")

    def run(emu: tuple[str, int] | None) -> str:
        proc = subprocess.run(
            [sys.executable, "quickstart.py"],
            capture_output=True,
            text=True,
            env=_environ(replace(quickstart, emu=emu)),
            cwd=tmp_path,
            timeout=_TIMEOUT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(run, [quickstart.emu, None]))
    for output, expected in zip(outputs, printed, strict=True):
        assert output == expected, f"prints:\n{output}\nthe README says:\n{expected}"
