"""Every hook is documented in docs/hooks.md (kept in sync) and its example plugin works."""

from __future__ import annotations

import inspect
import pathlib
import re
import sys
import textwrap
import types

import accelreg
from accelreg import hookspecs

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import gen_hooks  # noqa: E402


def _example(hook: str) -> str:
    return textwrap.dedent(inspect.getdoc(getattr(hookspecs, hook)).partition("::\n")[2])


def test_hooks_md_is_generated_from_the_hookspecs():
    assert gen_hooks.hook_names() == ["accelreg_backends", "accelreg_placement_rules"]
    assert (ROOT / "docs" / "hooks.md").read_text() == gen_hooks.render(), "run python docs/gen_hooks.py"


def test_every_hook_is_exercised_by_a_test():
    tests = "\n".join(
        p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != pathlib.Path(__file__).name
    )
    for hook in gen_hooks.hook_names():
        assert re.search(rf"\b{hook}\b", tests), f"no test exercises {hook}"


def _load(hook: str) -> types.ModuleType:
    module = types.ModuleType(f"fakeplugin_example_{hook}")
    exec(compile(_example(hook), module.__name__, "exec"), module.__dict__)
    return module


def test_backends_example_plugin_runs():
    accelreg.register(_load("accelreg_backends"), "fakeplugin_example")
    acme = {b.name: b for b in accelreg.backends()}["acme"]
    assert not acme.available and acme.reason == "torch_acme is not installed"
    assert acme.visible_devices_var == "ACME_VISIBLE_DEVICES"


def test_placement_rules_example_plugin_runs():
    accelreg.register(_load("accelreg_placement_rules"), "fakeplugin_example_rules")
    from accelreg import registry

    rules = [r for _, r in registry.get().rules("npu")]
    assert [r.quant_method for r in rules if r.quant_method == "acme_int8"] == ["acme_int8"]
    assert not [r for _, r in registry.get().rules("cpu") if r.quant_method == "acme_int8"]
