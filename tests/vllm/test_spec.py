"""``BackendSpec.vllm_platform`` (validated by the registry, declared by the built-ins) and vLLM's
section of ``accelreg env`` — which reads the installed packages and imports neither vLLM nor any
platform plugin. These run with or without vLLM installed (fast, in the default suite)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

import accelreg
from accelreg import registry
from accelreg.cli import main
from accelreg.integrations import vllm as ar_vllm

from . import _fakes

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(
    ("declared", "kept"),
    [
        (None, None),
        ("ascend", ("ascend",)),
        (("cuda", "rocm"), ("cuda", "rocm")),
        (["vllm-gaudi"], ("vllm-gaudi",)),
        ("vllm_acme.platform.AcmePlatform", ("vllm_acme.platform.AcmePlatform",)),
    ],
)
def test_the_registry_keeps_a_declared_platform_as_a_tuple(declared, kept):
    _fakes.register(_fakes.backend("acme", 95, declared))
    assert registry.get().backend("acme").spec.vllm_platform == kept


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        (123, "must be a name or a tuple of 1-8 names"),
        ((), "must be a name or a tuple of 1-8 names"),
        (("a",) * 9, "must be a name or a tuple of 1-8 names"),
        ("two words", "'two words' of 'acme' is not a vLLM platform name or a platform class path"),
        (("cuda", 7), "7 of 'acme' is not a vLLM platform name"),
        ("vllm_acme.", "is not a vLLM platform name or a platform class path"),
    ],
)
def test_a_bad_declaration_is_a_plugin_failure_naming_the_plugin(declared, problem):
    _fakes.register(_fakes.backend("acme", 95, declared), name="acme-plugin")
    snap = registry.get()
    assert "acme" not in snap.by_name
    failure = next(f for f in snap.failures if f.plugin == "acme-plugin")
    assert failure.stage == "accelreg_backends" and problem in failure.error


def test_the_builtins_declare_vllms_names_for_their_platforms():
    declared = {b.name: b.spec.vllm_platform for b in registry.get().order if b.plugin.builtin}
    assert declared["cpu"] == ("cpu",)
    assert declared["cuda"] == ("cuda", "rocm")
    assert declared["xpu"] == ("xpu",)
    assert declared["npu"] == ("ascend",)  # vllm-ascend's entry point
    assert declared["hpu"] == ("hpu",)  # vllm-gaudi's entry point
    assert declared["mlu"] is None  # no vLLM platform plugin: the registry platform


def test_env_has_a_vllm_section_without_importing_vllm(capsys):
    _fakes.register(_fakes.backend("acme", 95))
    before = set(sys.modules)
    assert main(["env", "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["vllm"]
    assert not {m for m in set(sys.modules) - before if m == "vllm" or m.startswith("vllm.")}
    if not HAVE_VLLM:
        assert section == {
            "version": None,
            "distribution": None,
            "scope": "not installed",
            "activated": False,
            "platform": None,
            "error": None,
            "backends": [],
            "plugins": [],
        }
        assert main(["env"]) == 0 and "vLLM " not in capsys.readouterr().out
        return
    assert section["scope"].startswith("what the registry would choose")
    assert section["platform"] == {
        "backend": "acme",
        "platform": "registry",
        "class": "accelreg.integrations.vllm.platform.platform",
        "why": "acme is the first available backend by default plugin priorities; backend 'acme' (plugin 'acme' "
        "of <registered>) declares no vLLM platform of its own: accelreg's registry platform serves it (no vLLM "
        "platform plugin is installed)",
    }
    assert {p["name"]: p["state"] for p in section["plugins"]}["cpu"] == "vLLM's own"
    assert section["activated"] is False
    rows = {r["backend"]: r for r in section["backends"]}
    assert (rows["acme"]["platform"], rows["acme"]["device_type"], rows["acme"]["error"]) == (
        "registry",
        "acme",
        None,
    )
    assert rows["acme"]["why"] == section["platform"]["why"].split("; ", 1)[1]  # the same, without why acme
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"vLLM {section['version']} ({section['distribution']}): what the registry would choose" in text
    assert "  platform: registry (accelreg.integrations.vllm.platform.platform) for backend acme" in text
    assert main(["env", "--report"]) == 0
    report = capsys.readouterr().out
    assert "**vLLM**" in report and max(len(line) for line in report.splitlines()) <= 100


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (nox -s vllm runs this in its layer)")
def test_env_says_why_vllm_would_not_start(capsys, monkeypatch):
    monkeypatch.setenv("ACCELREG_PRIORITY", "acme,cpu")
    accelreg.reset()
    _fakes.register(_fakes.backend("acme", 5, "nosuch"), name="acme-plugin")
    section = ar_vllm.report()
    assert section["platform"] is None
    assert section["error"].startswith(
        "backend 'acme' (plugin 'acme-plugin' of <registered>) declares the vLLM"
    )
    assert "vLLM would not start under accelreg" in section["error"]
