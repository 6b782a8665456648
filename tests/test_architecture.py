"""The shape of the package: no import circles, layers that import only downwards, backends
that use only the plugin surface, and a facade that serves exactly what it lists.

The graph comes from ``tools/imports.py`` (every import of the package's own modules, including
those inside functions; ``TYPE_CHECKING`` blocks left out).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import imports

#: The layers, lowest first; a module imports only from its own layer and the ones below. The
#: facade (``accelreg``) imports nothing but the errors at import time and serves the rest lazily,
#: so it counts as the bottom.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "accelreg",
        "accelreg._text",
        "accelreg._warn",
        "accelreg.errors",
        "accelreg.types",
        "accelreg.dtypes",
        "accelreg.sizes",
        "accelreg.entrypoints",
        "accelreg.deferred",
        # imported at interpreter start-up in every job process, by the start-up hook: nothing
        # of accelreg below them, so the registry, the integrations and launch can all use them
        "accelreg.flags",
        "accelreg.importwatch",
    ),
    ("accelreg.config", "accelreg.hookspecs"),
    ("accelreg.registry", "accelreg.builtin", "accelreg.plugin"),
    ("accelreg.resolution",),
    ("accelreg.queries", "accelreg.placement"),
    ("accelreg.planner",),
    ("accelreg.integrations",),
    ("accelreg.meta",),
    ("accelreg.launch",),
    ("accelreg.cli", "accelreg.testing", "accelreg.__main__"),
)

#: Imports that stay inside a function, and why (anything else belongs at the top of its module).
LAZY_ALLOWED = {
    ("accelreg.cli.plan", "accelreg.planner.plot"): "matplotlib, only when --plot is given",
    ("accelreg.launch.job", "accelreg.launch.masks"): (
        "`accelreg run -- CMD` without --devices starts CMD without the registry (paid once per job)"
    ),
    ("accelreg.launch.job", "accelreg.launch.slurm"): (
        "only a task of a Slurm step (SLURM_STEP_ID set) needs the registry to mask its allocation"
    ),
    ("accelreg.launch.startup", "accelreg.launch.slurm_task"): (
        "outside a Slurm step (SLURM_STEP_ID unset) the start-up hook imports nothing for Slurm"
    ),
    ("accelreg.launch.startup", "accelreg.launch.slurm"): (
        "every Python process under `accelreg run` runs the start-up hook; only the first one of "
        "a Slurm task whose mask is not set loads the registry"
    ),
    ("accelreg.integrations", "accelreg.integrations._machinery.seams"): (
        "every Python process under `accelreg run` imports accelreg.integrations at start-up; "
        "the registry (pluggy, the plugins) waits until install() runs"
    ),
    ("accelreg.integrations.transformers.device_map", "accelreg.planner"): (
        "every job process that imports transformers imports this folder; the planner (about "
        "40 ms) waits for the first device_map that asks for a plan"
    ),
    ("accelreg.integrations.transformers.quantizers", "accelreg.placement"): (
        "the placement hooks wait for the first quantized load's postprocess_model"
    ),
    ("accelreg.integrations", "accelreg.registry"): (
        "an import hook that fires inside plugin code hands its work to the registry "
        "(after_build); the face itself is imported at every job process's start-up"
    ),
    ("accelreg.integrations", "accelreg.registry.containment"): (
        "the same hook asks whether it runs inside plugin code, only when it fires"
    ),
    ("accelreg.registry", "accelreg.registry.snapshot"): (
        "install() reads only the settings; building a snapshot loads the plugin machinery "
        "(pluggy, the plugin types: about 12 ms of every rank's install())"
    ),
    **dict.fromkeys(
        [
            ("accelreg.integrations._machinery.precision", "accelreg.queries"),
            ("accelreg.integrations.accelerate.precision", "accelreg.queries"),
            ("accelreg.integrations.accelerate.state", "accelreg.queries"),
            ("accelreg.integrations.torch.sharded", "accelreg.queries"),
            ("accelreg.integrations.accelerate.modeling", "accelreg.placement"),
        ],
        "a seam's replacement asks the registry when it is called; enabling it (install()) "
        "imports neither the queries nor the placement rules (docs/benchmarks.md)",
    ),
    ("accelreg.integrations._machinery.table", "accelreg.integrations._machinery.seams"): (
        "the start-up hook reads the table's triggers; the integration modules (and the registry "
        "under them) load when the table's rows are first asked for"
    ),
}

GRAPH = imports.build()


def _layer(module: str) -> int:
    best, found = -1, -1
    for i, layer in enumerate(LAYERS):
        for part in layer:
            if (module == part or module.startswith(part + ".")) and len(part) > best:
                best, found = len(part), i
    assert found >= 0, f"{module} is in no layer of tests/test_architecture.py: place it"
    return found


def test_the_import_graph_has_no_cycles() -> None:
    assert GRAPH.cycles() == []


def test_every_module_has_a_layer_and_imports_only_downwards() -> None:
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in GRAPH.edges.items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def test_the_registry_is_the_bottom_layer_and_reads_alone() -> None:
    """The registry imports only the records, settings and errors below it (and the built-ins'
    table of entry points, for a source tree that was never installed)."""
    allowed = {layer for layer in LAYERS[0] + LAYERS[1]} | {"accelreg.builtin"}
    for module, targets in GRAPH.edges.items():
        if module.startswith("accelreg.registry"):
            outside = {t for t in targets if not t.startswith("accelreg.registry")} - allowed
            assert not outside, f"{module} imports {sorted(outside)}"


def test_builtin_backends_use_only_the_plugin_surface() -> None:
    """accelreg's own backends are written as a vendor writes one: ``accelreg.plugin`` alone."""
    for module, targets in GRAPH.edges.items():
        if module.startswith("accelreg.builtin."):
            outside = {t for t in targets if not t.startswith("accelreg.builtin")} - {"accelreg.plugin"}
            assert not outside, f"{module} imports {sorted(outside)}"


def test_imports_inside_functions_are_the_allowed_few() -> None:
    lazy = {(module, target) for module, _, target in GRAPH.lazy}
    assert lazy <= set(LAZY_ALLOWED), sorted(lazy - set(LAZY_ALLOWED))


def test_import_accelreg_loads_only_the_errors() -> None:
    code = (
        "import sys, accelreg\n"
        "print(sorted(m for m in sys.modules if m.startswith('accelreg')), "
        "'torch' in sys.modules, 'pluggy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['accelreg', 'accelreg.errors'] False False"


def test_the_facade_serves_exactly_what_it_lists() -> None:
    import accelreg

    for name in accelreg.__all__:
        assert getattr(accelreg, name) is not None, name
    served = set(accelreg._OWNERS)
    eager = {n for n in accelreg.__all__ if n not in served}
    assert eager == {n for n in dir(accelreg.errors) if n.endswith("Error")}
    assert served <= set(accelreg.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        accelreg.nonesuch  # noqa: B018 - the attribute access is the test


def test_every_error_is_an_accelreg_error() -> None:
    from accelreg import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.AccelregError), name


def test_the_plugin_surface_is_one_import() -> None:
    from accelreg import plugin

    for name in plugin.__all__:
        assert getattr(plugin, name) is not None
    assert {"hookimpl", "BackendSpec", "Availability", "MemoryInfo", "PlacementRule"} <= set(plugin.__all__)


def test_strategy_words_are_reserved_backend_names() -> None:
    from accelreg.planner import STRATEGIES
    from accelreg.registry.records import RESERVED

    assert set(STRATEGIES) <= RESERVED


@pytest.mark.parametrize("name", ["meta", "placement", "testing", "cli", "launch", "sizes"])
def test_public_module_names_keep_working(name: str) -> None:
    """Modules that moved into packages keep their public import names."""
    module = importlib.import_module(f"accelreg.{name}")
    assert module.__all__


def test_no_module_reaches_into_another_packages_private_names() -> None:
    """A private (``_name``) module or name belongs to the package of the module that defines it:
    only modules inside that package use it (``python tools/imports.py`` lists any other use)."""
    assert GRAPH.private == []


def test_the_private_reach_check_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "accelreg"
    for folder, files in {
        "a": {"_inner.py": "def _f():\n    pass\n", "mod.py": "def _g():\n    pass\n"},
        "b": {},
    }.items():
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        for name, text in files.items():
            (package / folder / name).write_text(text)
    (package / "__init__.py").write_text("")
    (package / "b" / "user.py").write_text(
        "from ..a import _inner\nfrom ..a.mod import _g\nfrom ..a import mod\nmod._g()\n"
    )
    (package / "a" / "friend.py").write_text("from . import _inner\nfrom .mod import _g\n")
    reaches = sorted(target for _, _, target in imports.build(package).private)
    assert reaches == ["accelreg.a._inner", "accelreg.a.mod._g", "accelreg.a.mod._g"]


#: Words that only an on/off vocabulary holds (lower case, as a parser compares them after
#: ``.lower()``; ``str(bool)``'s "True" is not one).
_ON_OFF = {"true", "yes", "false"}


def _on_off_words(source: str, where: str) -> list[str]:
    """Where ``source`` spells an on/off word in a tuple, list or set, or compares with one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Compare):
            items = node.comparators
        else:
            continue
        found += [
            f"{where}:{item.lineno}: {item.value!r}"
            for item in items
            if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in _ON_OFF
        ]
    return found


def test_on_and_off_words_are_written_out_only_in_accelreg_flags() -> None:
    """accelreg reads its yes/no values with ``accelreg.flags``' one parser, and another library's
    variable with that library's own helper: no second list of the words (issue 40: the vLLM
    integration's ``_YES``, the accelerate integration's reading of ``ACCELERATE_USE_CPU``)."""
    package = Path(__file__).resolve().parent.parent / "accelreg"
    found = [
        hit
        for path in sorted(package.rglob("*.py"))
        if path.name != "flags.py" or path.parent != package
        for hit in _on_off_words(path.read_text(encoding="utf-8"), str(path.relative_to(package.parent)))
    ]
    assert found == []


def test_the_on_and_off_words_check_can_fail() -> None:
    source = '_YES = ("1", "true", "yes", "on")\nok = os.environ.get("X", "").lower() in ("1", "true")\n'
    assert _on_off_words(source, "m.py") == ["m.py:1: 'true'", "m.py:1: 'yes'", "m.py:2: 'true'"]
    assert _on_off_words('ok = str(flag) == "True"\nOFF = ("none", "no", "off")\n', "m.py") == []


def test_the_registry_serves_every_name_it_lists_from_the_module_that_defines_it() -> None:
    """``accelreg.registry`` serves its snapshot-side names at first use (install() does not load
    them); each is the defining module's own object, and every listed name resolves."""
    import importlib

    from accelreg import registry

    for name, module in registry._LAZY.items():
        owner = importlib.import_module(f"accelreg.registry.{module}")
        assert getattr(registry, name) is getattr(owner, name), name
    assert all(getattr(registry, name) is not None for name in registry.__all__)
    assert set(registry._LAZY) <= set(registry.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        registry.nonesuch  # noqa: B018 - the attribute access is the test
