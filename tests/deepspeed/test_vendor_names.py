"""accelreg names no vendor outside ``accelreg/builtin/``: an AST scan of the code (docstrings
and messages to people excluded), so a framework integration can only ask the registry.

What counts as a vendor name: the accelerator backends that plug into torch from outside or as
vendor device types (npu, xpu, mlu, musa, sdaa, hpu, mps), their runtime packages and their
collective libraries — as a whole string value (``"npu"``, ``"torch_npu"``), a ``_``-separated
part of one (``"MLU_VISIBLE_DEVICES"``) or of a name (``is_npu_available``, ``torch.npu``).
Strings with whitespace are messages to people (``"such as 'npu:0'"`` in an error) and are not
scanned. ``cuda`` (and NVIDIA's, AMD's runtime names) count too: the built-in cuda backend is a
backend like any other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import accelreg

ROOT = Path(accelreg.__file__).resolve().parent
VENDOR = (
    "npu|xpu|mlu|musa|sdaa|hpu|mps|supa|klxpu|"
    "torch_npu|torch_mlu|torch_musa|torch_sdaa|habana|habana_frameworks|ipex|ascend|cambricon|gaudi|"
    "nccl|hccl|xccl|cncl|mccl|tccl|rccl|cuda|nvidia|rocm"
)
_TOKEN = re.compile(rf"(?:^|[^a-z0-9])({VENDOR})(?=$|[^a-z0-9])", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def vendor_names(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every vendor name in the code of ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if not any(c.isspace() for c in node.value):
                text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        elif isinstance(node, ast.alias):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module
        if text and _TOKEN.search(text.replace("_", " ")):
            found.append((getattr(node, "lineno", 0), text))
    return found


def test_the_scan_finds_vendor_names() -> None:
    """The scan can fail: each of these is flagged, the messages and docstrings are not."""
    code = '''
"""Docstring naming npu and torch_npu: fine."""
import torch_npu
from habana_frameworks import torch as ht
if is_npu_available():
    x = torch.mlu.device_count()
VAR = "ASCEND_RT_VISIBLE_DEVICES"
backend = "hccl"
names = ("musa", "sdaa:0")
def f(xpu_index): ...
raise ValueError("expected a device such as 'npu:0'")
'''
    found = sorted(text for _, text in vendor_names(code))
    assert found == sorted(
        [
            "torch_npu",
            "habana_frameworks",
            "is_npu_available",
            "mlu",
            "ASCEND_RT_VISIBLE_DEVICES",
            "hccl",
            "musa",
            "sdaa:0",
            "xpu_index",
        ]
    ), found


def test_accelreg_outside_builtin_names_no_vendor() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "builtin":
            continue
        offenders += [f"accelreg/{rel}:{line}: {text!r}" for line, text in vendor_names(path.read_text())]
    assert not offenders, "vendor names outside accelreg/builtin/ (ask the registry instead):\n" + "\n".join(
        offenders
    )
