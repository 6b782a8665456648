"""Regenerate docs/hooks.md from the hookspec docstrings: ``python docs/gen_hooks.py``.

tests/test_hooks_documented.py fails when hooks.md is out of date.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

from accelreg import hookspecs

INTRO = """# Hooks reference

The vendor contract. A plugin implements any of these functions, decorated with
`accelreg.hookimpl`, in a module or object that reaches accelreg through the `accelreg`
entry-point group or `accelreg.register()`. Only the frozen records of `accelreg.types` cross
the boundary. Every hook below is exercised by `tests/test_hooks_documented.py`, which also
runs each example plugin. See [writing a backend plugin](plugins.md) for the whole recipe.
"""


def hook_names() -> list[str]:
    return sorted(n for n, f in vars(hookspecs).items() if n.startswith("accelreg_") and callable(f))


def render() -> str:
    out = [INTRO]
    for name in hook_names():
        fn = getattr(hookspecs, name)
        sig = str(inspect.signature(fn)).replace("'", "")
        head, _, example = inspect.getdoc(fn).partition("::\n")
        head = re.sub(r":(class|func):`~?([^`]+)`", r"`\2`", head).replace("``", "`")
        head = re.sub(r"^    (.*)$", r"- \1", head, flags=re.M)
        out += [f"## `{name}{sig}`", "", head.rstrip().rstrip(":") + ":", ""]
        out += ["```python", textwrap.dedent(example).strip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    Path(__file__).with_name("hooks.md").write_text(render())
