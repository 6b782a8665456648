"""The ``--json`` outputs of ``env``, ``config``, ``resolve`` and ``plan`` match the JSON Schemas
shipped in ``accelreg/schemas/``, and every key they print is described there.

The validator below covers the JSON Schema keywords the schemas use (and refuses any other, so a
schema cannot silently say more than is checked); where the ``jsonschema`` package is installed
the outputs are validated with it as well.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

import accelreg
from accelreg.cli import main
from accelreg.types import BackendSpec

README_PLAN = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "$comment"}
_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def schema(name: str) -> dict[str, Any]:
    text = resources.files("accelreg").joinpath("schemas", f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def problems(value: Any, node: dict[str, Any], root: dict[str, Any], where: str = "$") -> list[str]:
    """What is wrong with ``value`` against schema ``node``; an object key the schema does not
    describe is a problem too (the schemas document every key)."""
    unknown = set(node) - _ANNOTATIONS - {
        "type", "properties", "required", "items", "additionalProperties", "enum", "anyOf", "minimum", "$ref",
    }  # fmt: skip
    if unknown:
        raise AssertionError(f"{where}: schema keywords this validator does not check: {sorted(unknown)}")
    out: list[str] = []
    if "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        out += problems(value, target, root, where)
    if "anyOf" in node:
        branches = [problems(value, b, root, where) for b in node["anyOf"]]
        if all(branches):
            out.append(f"{where}: matches none of anyOf: {min(branches, key=len)}")
    kinds = node.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return [*out, f"{where}: {value!r} is not {' or '.join(kinds)}"]
    if "enum" in node and value not in node["enum"]:
        out.append(f"{where}: {value!r} not in {node['enum']}")
    if "minimum" in node and isinstance(value, (int, float)) and value < node["minimum"]:
        out.append(f"{where}: {value} < {node['minimum']}")
    if isinstance(value, dict):
        props = node.get("properties", {})
        out += [f"{where}: missing {key!r}" for key in node.get("required", ()) if key not in value]
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                out += problems(item, props[key], root, f"{where}.{key}")
            elif isinstance(extra, dict):
                out += problems(item, extra, root, f"{where}.{key}")
            elif extra is False or (props and "$ref" not in node and "anyOf" not in node):
                out.append(f"{where}: key {key!r} is not described in the schema")
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            out += problems(item, node["items"], root, f"{where}[{i}]")
    return out


def check(name: str, data: Any) -> None:
    root = schema(name)
    assert problems(data, root, root) == []
    try:
        import jsonschema
    except ImportError:  # the validator above has checked it
        return
    jsonschema.Draft202012Validator(root).validate(data)


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_validator_rejects_what_it_should():
    node = {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": ["string", "null"]}},
    }
    assert problems({"a": 1, "b": None}, node, node) == []
    assert problems({"a": True}, node, node) == ["$.a: True is not integer"]
    assert problems({"a": -1, "c": 1}, node, node) == [
        "$.a: -1 < 0",
        "$: key 'c' is not described in the schema",
    ]
    assert problems({}, node, node) == ["$: missing 'a'"]
    with pytest.raises(AssertionError, match="pattern"):
        problems("x", {"pattern": "y"}, {})


def test_env(capsys, monkeypatch):
    code, data = run_json(capsys, "env")
    assert code == 0 and data["backends"]
    check("env", data)
    from accelreg.types import Availability

    def broken() -> Availability:
        raise RuntimeError("driver gone")

    plugin = type("P", (), {})()
    plugin.accelreg_backends = accelreg.hookimpl(
        lambda: [BackendSpec(name="acme", priority=5, is_available=broken, device_count=lambda: 1)]
    )
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1,0")
    monkeypatch.setenv("MLU_VISIBLE_DEVICES", "x")
    monkeypatch.setenv("ACCELREG_DISABLE", "emu")
    monkeypatch.setenv("ACCELREG_PRIORITY", "npu,nosuch")
    accelreg.reset()
    accelreg.register(plugin, name="acme")
    # the report lists each warning; the command does not repeat it as a RuntimeWarning
    code, data = run_json(capsys, "env")
    assert code == 0 and data["failures"] and data["skipped"]
    assert any("nosuch" in w for w in data["warnings"])
    assert {b["name"]: b["visible_devices"] for b in data["backends"]}["npu"] == ["1", "0"]
    check("env", data)


def test_config(capsys, monkeypatch, tmp_path):
    code, data = run_json(capsys, "config")
    assert code == 0
    check("config", data)
    (tmp_path / "accelreg.toml").write_text("priority = [\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELREG_PROVIDERS", "npu=acme-npu")
    monkeypatch.setenv("ACCELREG_PLUGINS", "acme")
    accelreg.reset()
    code, data = run_json(capsys, "config")
    assert code == 3 and data["errors"]
    check("config", data)


@pytest.mark.parametrize("spec", [[], ["cpu"], ["0"], ["npu:1"]])
def test_resolve(capsys, spec):
    code, data = run_json(capsys, "resolve", *spec)
    assert code == (0 if spec in ([], ["cpu"]) else 1)
    check("resolve", data)


def test_plan(capsys, tmp_path):
    code, data = run_json(capsys, *README_PLAN)
    assert code == 0 and data["device_map"]
    check("plan", data)
    (tmp_path / "x.svg").mkdir()  # cannot be written: the plan, then the plot's error
    code, data = run_json(capsys, *README_PLAN, "--plot", str(tmp_path / "x.svg"))
    assert code == 1 and data["plot_error"]
    check("plan", data)
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=1MB")
    assert code == 1 and data["violations"]
    check("plan", data)
