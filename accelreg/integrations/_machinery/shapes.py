"""What a seam *is*: fingerprints of functions, and their source found without importing.

:func:`shape` fingerprints a function by its syntax tree (docstrings and annotations left out),
so the integrations table can say which shape each adapter was verified with; :func:`node_in_source`
finds a function in a library's source files without importing the library (``accelreg env`` in a
process that has not imported it, and the static survey of every release's wheel), or the
module-level import that binds a name a compiled extension defines.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
import inspect
import os
import textwrap
from typing import Any

__all__ = ["ABSENT", "fingerprint", "forget_sources", "node_in_source", "params_of_node", "shape"]


def params_of_node(node: ast.AST) -> tuple[str, ...] | None:
    """The parameter names of a function node (``None`` for a class or other node)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return tuple(names)


def _source_file(module: str, root: str | None) -> str | None:
    """The ``.py`` file of ``module``, found without importing it or its parent packages (a
    ``find_spec`` of a dotted name imports the parents, which for peft means transformers and
    bitsandbytes: seconds of imports, and their import-time messages, in ``accelreg env``)."""
    top, _, rest = module.partition(".")
    if root is not None:
        bases = [os.path.join(root, top)]
    else:
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: located, not imported
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if not rest:
            origin = getattr(spec, "origin", None)
            return origin if origin and origin.endswith(".py") else None
        bases = list(spec.submodule_search_locations or ())
    for base in bases:
        path = os.path.join(base, *rest.split(".")) if rest else base
        for candidate in (path + ".py", os.path.join(path, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


_PARSED: dict[str, ast.Module] = {}
#: What :func:`node_in_source` answers for a module that exists without the name.
ABSENT = "does not exist"


def node_in_source(module: str, dotted: str, root: str | None) -> ast.AST | str:
    """The syntax-tree node of ``module.dotted`` read from the source (under ``root``, a folder
    holding unpacked packages; default: where the package is installed), importing nothing; or
    why there is none: :data:`ABSENT` when the module exists and the name does not."""
    path = _source_file(module, root)
    if path is None:
        return "not found (no such module source)"
    tree = _PARSED.get(path)
    if tree is None:
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError) as exc:
            return f"source unreadable ({exc})"
        _PARSED[path] = tree
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    parts = dotted.split(".")
    for part in parts:
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None and len(parts) == 1:
            node = _imported(body, part)
        if node is None:
            return ABSENT
        body = getattr(node, "body", [])
    assert node is not None
    return node


def _imported(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The module-level ``import`` that binds ``name`` (a class a compiled extension defines
    and the package re-exports: ``from ._safetensors_rust import safe_open``), as the live match
    finds it in the module: it exists, with no source of its own to fingerprint."""
    for n in body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                # ``import a.b`` binds ``a``; ``from m import a`` binds ``a``; ``as x`` binds ``x``
                bound = alias.asname or alias.name.split(".")[0]
                if bound == name:
                    return n
    return None


def shape(func: Any) -> str:
    """Fingerprint of what a function *is*: the sha256 prefix of its syntax tree with the
    docstrings and type annotations left out, so a reformatted annotation or a reworded
    docstring is the same shape and any change of code is a new one. Takes a function or
    an ``ast`` function node (the static survey reads source files without importing)."""
    if isinstance(func, ast.AST):
        node = func
    else:
        try:
            node = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
        except (OSError, TypeError, SyntaxError, IndexError):
            return "<no source>"
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n.returns = None
            body = n.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
            ):
                if isinstance(body[0].value.value, str):
                    n.body = body[1:] or [ast.Pass()]
        elif isinstance(n, ast.arg):
            n.annotation = None
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


def fingerprint(func: Any) -> str:
    """sha256 prefix of a function's exact source (the older, stricter fingerprint)."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return "<no source>"
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def forget_sources() -> None:
    """Drop the parsed source files (the static survey reads one release's wheel after another)."""
    _PARSED.clear()
