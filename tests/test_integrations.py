"""The integrations on this CPU machine, against the real libraries (no mocks of them).

What is checked:

* ``enable()``/``disable()`` of transformers, accelerate, peft and DeepSpeed: every holder of a
  seam (the defining module and every module that imported it by name) is patched, and
  ``disable()`` puts back the identical objects — compared by identity against a snapshot of
  ``vars()`` of every module of the four libraries and of every class a seam lives on;
  idempotence, the context managers, ``install()``/``uninstall()``, late by-name importers.
* Refusals that patch nothing: an untested library version, a private function whose source
  changed (fingerprint), a changed signature, a failure half-way through.
* 16 threads enabling and disabling concurrently end all-patched or all-restored.
* Behaviour through ``accelreg.install()``: device_map ints/strings, ``"auto"`` planned by
  accelreg, user maps validated, longest-prefix expansion, bitsandbytes 8-/4-bit loads with
  placement hooks, peft's ``infer_device``, accelerate's ``get_max_memory``.
* ``accelreg env`` (text and ``--json``): the integrations section, in a fresh process and in
  one that called ``install()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import threading
import types
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("peft")
pytest.importorskip("deepspeed")
pytest.importorskip("bitsandbytes")

import accelreg  # noqa: E402
import accelreg.integrations as integrations  # noqa: E402
from accelreg import DeviceError, DeviceMapError  # noqa: E402
from accelreg.errors import IntegrationError, PlacementError  # noqa: E402
from accelreg.integrations import _postimport, _seams  # noqa: E402

from ._fakes import plugin, spec  # noqa: E402

NAMES = tuple(integrations.INTEGRATIONS)  # accelerate, transformers, peft, deepspeed, ray, ray_train

import transformers  # noqa: E402


def _defines(module: str, name: str) -> bool:
    """Whether ``module``'s source defines ``name`` (read, not imported: collection imports no
    more of transformers than the tests do)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None and f"def {name}(" in Path(spec.origin).read_text()


#: Where from_pretrained normalises device_map inline (transformers 4.57: no
#: check_and_set_device_map, and expand_device_map matches exact prefixes itself), the tests of
#: those two seams have nothing to call: guarded by the seam, not the version.
needs_check_and_set = pytest.mark.skipif(
    not _defines("transformers.integrations.accelerate", "check_and_set_device_map"),
    reason=f"transformers {transformers.__version__} normalises device_map inline in from_pretrained "
    "(no check_and_set_device_map seam)",
)
PREFIXES = (
    "transformers",
    "accelerate",
    "peft",
    "deepspeed",
    "ray",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
)
ROOT = Path(__file__).resolve().parents[1]


def _module(name):
    return importlib.import_module(integrations.INTEGRATIONS[name][0])


def _integration(name):
    return _module(name).INTEGRATION


# -- module-wide setup --------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def libraries():
    """Import every library, every seam module and every declared importer once, so that
    each snapshot sees the complete set of holders; and start with nothing enabled."""
    integrations.uninstall()
    import deepspeed  # noqa: F401 - its import is part of the state under test

    for name in NAMES:
        for seam in _integration(name).seams:
            for module in (seam.module, *seam.importers):
                try:  # an importer of one release may not exist in another
                    importlib.import_module(module)
                except ImportError:
                    pass
    yield
    integrations.uninstall()


@pytest.fixture(autouse=True)
def restored():
    """Every test leaves every integration disabled and nothing waiting for an import."""
    yield
    integrations.uninstall()
    assert not any(_integration(n).enabled for n in NAMES)


# -- snapshots ----------------------------------------------------------------------------
def _owners(integ):
    """``(seam, owner, attr)`` of every seam this release patches (the adapter that matches
    says where the seam lives here; a seam with nothing to patch is left out)."""
    out = []
    for m in integ.match():
        if m.adapter is None or m.adapter.make is None:
            continue
        out.append((m.seam, m.owner, (m.adapter.target or m.seam.name).rsplit(".", 1)[-1]))
    return out


def _is_replacement(value):
    if not isinstance(value, (types.FunctionType, staticmethod, classmethod)):
        return False
    return getattr(getattr(value, "__func__", value), _seams._MARK, None) is not None


class Snapshot:
    """``vars()`` of every module of the four libraries and of every seam-owning class, and
    ``inspect.getattr_static`` of every seam, taken now; :meth:`diff` lists what changed."""

    def __init__(self, names=NAMES):
        self.names = names
        self.modules = {
            name: dict(vars(m))
            for name, m in list(sys.modules.items())
            if m is not None and name.split(".")[0] in PREFIXES
        }
        self.seams = {}  # (integration, seam name) -> (owner, attr, original)
        self.classes = {}
        for n in names:
            for seam, owner, attr in _owners(_integration(n)):
                self.seams[(n, seam.name)] = (owner, attr, inspect.getattr_static(owner, attr))
                if isinstance(owner, type):
                    self.classes[owner] = dict(vars(owner))

    def diff(self):
        problems = []
        for name, before in self.modules.items():
            module = sys.modules.get(name)
            if module is None:
                problems.append(f"module {name} disappeared")
                continue
            now = vars(module)
            for key, value in before.items():
                if key not in now:
                    problems.append(f"{name}.{key} was removed")
                elif now[key] is not value:
                    problems.append(f"{name}.{key} is {now[key]!r}, was {value!r}")
            problems.extend(
                f"{name}.{key} (new) holds an accelreg replacement"
                for key in now.keys() - before.keys()
                if _is_replacement(now[key])
            )
        for name, module in list(sys.modules.items()):
            if module is not None and name not in self.modules and name.split(".")[0] in PREFIXES:
                problems.extend(
                    f"{name}.{key} (module imported later) holds an accelreg replacement"
                    for key, value in list(vars(module).items())
                    if _is_replacement(value)
                )
        for cls, before in self.classes.items():
            now = vars(cls)
            for key, value in before.items():
                if now.get(key) is not value:
                    problems.append(f"{cls.__qualname__}.{key} is {now.get(key)!r}, was {value!r}")
            problems.extend(f"{cls.__qualname__}.{key} was added" for key in now.keys() - before.keys())
        for (n, seam), (owner, attr, original) in self.seams.items():
            if inspect.getattr_static(owner, attr) is not original:
                problems.append(f"{n}: getattr_static({seam}) is not the original")
        return problems

    def holders(self, name):
        """``(holder, attr, original)`` for every place that held one of ``name``'s originals."""
        out = []
        for (n, _), (owner, attr, original) in self.seams.items():
            if n != name:
                continue
            out.append((owner, attr, original))
            if isinstance(owner, type):
                continue
            for module_name, before in self.modules.items():
                module = sys.modules[module_name]
                if module is owner:
                    continue
                out.extend((module, key, original) for key, value in before.items() if value is original)
        return out

    def state(self, name):
        """``"patched"`` (every holder holds a replacement of its original), ``"restored"``
        (every holder holds its original) or ``"mixed"``."""
        patched = restored = 0
        for holder, attr, original in self.holders(name):
            now = inspect.getattr_static(holder, attr) if isinstance(holder, type) else vars(holder)[attr]
            if now is original:
                restored += 1
            elif isinstance(original, property) or _seams.original(now) is original:
                patched += 1
        total = len(self.holders(name))
        return "patched" if patched == total else "restored" if restored == total else "mixed"


# -- enable / disable ---------------------------------------------------------------------
#: At least this many holders per integration (the defining modules plus by-name importers).
MIN_HOLDERS = {
    "accelerate": 12,
    "transformers": 5,
    "peft": 6,
    "deepspeed": 1,
    "ray": 5,
    "ray_train": 5,
    "lightning": 14,  # 2.2 has no model_parallel strategies (2.6: 16)
    "lightning_fabric": 10,  # (2.6: 12)
    "pytorch_lightning": 4,
}


@pytest.mark.parametrize("name", NAMES)
def test_enable_patches_every_holder_and_disable_restores_identical_objects(name):
    snap = Snapshot()
    integ = _integration(name)
    assert snap.state(name) == "restored"
    _module(name).enable()
    assert integ.enabled
    assert snap.state(name) == "patched"
    # the integration's own record covers exactly the holders an independent scan finds
    recorded = {(id(i.holder), i.attr) for i in integ._installed}
    scanned = {(id(h), a) for h, a, _ in snap.holders(name)}
    assert recorded == scanned
    # at least the defining holder of every seam, and by-name importers where the release has
    # them (accelerate 1.15: 18 holders, 1.10: 13; transformers 5.24: 9, 4.57: 5)
    assert len(recorded) >= max(len(_owners(integ)), MIN_HOLDERS[name])
    assert integ.status()["enabled"] is True
    # the other integrations were left alone
    for other in NAMES:
        if other != name:
            assert snap.state(other) == "restored"
    _module(name).disable()
    assert not integ.enabled
    assert snap.diff() == []


@pytest.mark.parametrize("name", NAMES)
def test_enable_and_disable_are_idempotent(name):
    snap = Snapshot()
    mod = _module(name)
    mod.enable()
    first = [(id(i.holder), i.attr, i.replacement) for i in mod.INTEGRATION._installed]
    mod.enable()  # a second enable changes nothing and does not wrap the wrappers
    assert [(id(i.holder), i.attr, i.replacement) for i in mod.INTEGRATION._installed] == first
    for holder, attr, replacement in ((i.holder, i.attr, i.replacement) for i in mod.INTEGRATION._installed):
        assert inspect.getattr_static(holder, attr) is replacement
    mod.disable()
    mod.disable()
    assert snap.diff() == []


@pytest.mark.parametrize("name", NAMES)
def test_context_manager_enables_for_the_block_only(name):
    snap = Snapshot()
    mod = _module(name)
    with mod.enabled():
        assert mod.INTEGRATION.enabled and snap.state(name) == "patched"
    assert not mod.INTEGRATION.enabled and snap.diff() == []

    with pytest.raises(KeyError), mod.enabled():
        raise KeyError("inside")
    assert snap.diff() == []

    mod.enable()  # already enabled: the block leaves it enabled
    with mod.enabled():
        pass
    assert mod.INTEGRATION.enabled and snap.state(name) == "patched"
    mod.disable()
    assert snap.diff() == []


def test_install_returns_the_enabled_names_and_uninstall_restores():
    snap = Snapshot()
    names = accelreg.install()
    assert names == list(NAMES)
    for name in NAMES:
        assert _integration(name).enabled, name
        assert snap.state(name) == "patched", name
    assert accelreg.install() == names  # again: nothing changes
    assert all(snap.state(n) == "patched" for n in NAMES)
    integrations.uninstall()
    assert snap.diff() == []
    assert not any(_integration(n).enabled for n in NAMES)


@pytest.mark.parametrize(
    ("name", "late_module", "source", "attr"),
    [
        (
            "accelerate",
            "accelerate._accelreg_late_importer",
            "from accelerate.utils.modeling import get_max_memory",
            "get_max_memory",
        ),
        (
            "peft",
            "transformers._accelreg_late_importer",
            "from peft.utils.other import infer_device",
            "infer_device",
        ),
    ],
)
def test_a_module_imported_after_enable_is_restored_too(name, late_module, source, attr):
    """A by-name importer inside the libraries' packages (the scan prefixes), imported after
    ``enable()``, holds the replacement; ``disable()`` gives it the original back."""
    snap = Snapshot()
    mod = _module(name)
    original = importlib.import_module(source.split()[1]).__dict__[attr]
    mod.enable()
    late = types.ModuleType(late_module)
    sys.modules[late_module] = late
    try:
        exec(source, vars(late))
        assert vars(late)[attr] is not original and _seams.original(vars(late)[attr]) is original
        mod.disable()
        assert vars(late)[attr] is original
        assert snap.diff() == []
    finally:
        del sys.modules[late_module]


# -- the seam is the guard, not the version ------------------------------------------------
def _fake_version(monkeypatch, distribution, version):
    real = metadata.version

    def version_of(dist):
        return version if dist == distribution else real(dist)

    monkeypatch.setattr(metadata, "version", version_of)


UNTESTED = {
    "accelerate": "1.17.0",
    "transformers": "5.26.0",
    "peft": "0.22.0",
    "deepspeed": "0.20.0",
    "ray": "2.61.0",
    "ray_train": "2.61.0",
    "lightning": "2.7.0",
    "lightning_fabric": "2.7.0",
    "pytorch_lightning": "2.7.0",
}


@pytest.fixture
def strict():
    accelreg.configure(strict=True)
    yield
    accelreg.reset()


@pytest.mark.parametrize("name", NAMES)
def test_an_untested_release_whose_seams_all_match_is_enabled_with_a_note(monkeypatch, recwarn, name):
    integ = _integration(name)
    _fake_version(monkeypatch, integ.distribution, UNTESTED[name])
    snap = Snapshot()
    _module(name).enable()
    assert integ.enabled and snap.state(name) == "patched"
    status = integ.status()
    assert status["version"] == UNTESTED[name] and status["in_range"] is False
    assert status["all_match"] is True and status["skipped"] == []
    assert f"{integ.distribution} {UNTESTED[name]}: not in the tested list; all seams match" in status["note"]
    assert not [w for w in recwarn if issubclass(w.category, integrations.IntegrationWarning)]
    _module(name).disable()
    assert snap.diff() == []


def test_an_unparsable_version_is_only_an_untested_one(monkeypatch):
    _fake_version(monkeypatch, "peft", "not-a-version")
    _module("peft").enable()
    assert _integration("peft").status()["note"].startswith("peft not-a-version: not in the tested list")


def test_install_on_untested_releases_enables_every_integration(monkeypatch):
    for name in ("transformers", "accelerate"):
        _fake_version(monkeypatch, _integration(name).distribution, UNTESTED[name])
    assert accelreg.install() == list(NAMES)
    assert all(_integration(n).enabled for n in NAMES)


def _unmatched_bnb4(monkeypatch):
    """transformers with a Bnb4BitHfQuantizer.update_device_map of a shape no adapter knows."""
    integ = _integration("transformers")
    seams = list(integ.seams)
    index = next(i for i, s in enumerate(seams) if s.name == "Bnb4BitHfQuantizer.update_device_map")
    assert 0 < index < len(seams) - 1  # seams before and after it still match
    seams[index] = replace(
        seams[index], adapters=tuple(replace(a, shapes=("0" * 16,)) for a in seams[index].adapters)
    )
    monkeypatch.setattr(integ, "seams", seams)
    return integ


def test_a_seam_matching_no_adapter_is_skipped_alone_with_one_warning(monkeypatch):
    integ = _unmatched_bnb4(monkeypatch)
    import transformers.modeling_utils as mu
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    stock4 = inspect.getattr_static(Bnb4BitHfQuantizer, "update_device_map")
    snap = Snapshot()
    with pytest.warns(integrations.IntegrationWarning) as caught:
        integ.enable()
    (warning,) = [w for w in caught if issubclass(w.category, integrations.IntegrationWarning)]
    message = str(warning.message)
    assert "Bnb4BitHfQuantizer.update_device_map skipped" in message and "0000000000000000" in message
    assert "lost: default device of a 4-bit load from the registry" in message
    assert "accelreg.device_map_for" in message  # the patch-free alternative
    assert integ.enabled
    assert inspect.getattr_static(Bnb4BitHfQuantizer, "update_device_map") is stock4  # skipped alone
    assert _seams.original(inspect.getattr_static(Bnb8BitHfQuantizer, "update_device_map")) is not None
    assert _seams.original(mu._get_device_map) is not mu._get_device_map  # the rest is on
    status = integ.status()
    assert status["skipped"] == [
        "transformers.quantizers.quantizer_bnb_4bit.Bnb4BitHfQuantizer.update_device_map"
    ]
    assert f"1 of {len(integ.seams)} seams match no adapter" in status["note"]
    integ.disable()
    assert snap.diff() == []


def test_strict_mode_raises_at_enable_and_patches_nothing(monkeypatch, strict):
    integ = _unmatched_bnb4(monkeypatch)
    snap = Snapshot()
    with pytest.raises(
        IntegrationError, match=r"match no adapter \(strict mode: nothing was patched\)"
    ) as info:
        integ.enable()
    assert "Bnb4BitHfQuantizer.update_device_map has shape" in str(info.value)
    assert not integ.enabled
    assert snap.diff() == []


def test_strict_install_raises_at_the_call_and_leaves_nothing_enabled(monkeypatch, strict):
    """accelerate comes first in install()'s order and is enabled, then undone."""
    _unmatched_bnb4(monkeypatch)
    snap = Snapshot()
    with pytest.raises(IntegrationError, match=r"Bnb4BitHfQuantizer\.update_device_map"):
        accelreg.install()
    assert not any(_integration(n).enabled for n in NAMES)
    assert not any(_postimport.pending(t) for _, t in integrations.INTEGRATIONS.values())
    assert snap.diff() == []


def test_a_changed_private_function_is_skipped(monkeypatch):
    import peft.utils.other

    def infer_device():  # same name and signature, different code
        return "cuda"

    monkeypatch.setattr(peft.utils.other, "infer_device", infer_device)
    with pytest.warns(
        integrations.IntegrationWarning, match=r"peft\.utils\.other\.infer_device skipped .*has shape"
    ):
        _module("peft").enable()
    assert peft.utils.other.infer_device is infer_device


def test_a_reformatted_private_function_still_matches():
    """The shape ignores docstrings and annotations: only a change of code is a new shape."""
    import ast

    sources = {
        "annotated": 'def f(device_map: dict | None, n: int = 1) -> dict:\n    """One."""\n    return {"": device_map}\n',
        "plain": 'def f(device_map, n=1):\n    return {"": device_map}\n',
        "changed": 'def f(device_map, n=2):\n    return {"": device_map}\n',
    }
    shapes = {k: _seams.shape(ast.parse(v).body[0]) for k, v in sources.items()}
    assert shapes["annotated"] == shapes["plain"] != shapes["changed"]


def test_a_changed_signature_is_skipped(monkeypatch):
    import accelerate.utils.memory

    def clear_device_cache():
        pass

    monkeypatch.setattr(accelerate.utils.memory, "clear_device_cache", clear_device_cache)
    with pytest.warns(integrations.IntegrationWarning, match=r"lacks parameters \['garbage_collection'\]"):
        _module("accelerate").enable()
    assert accelerate.utils.memory.clear_device_cache is clear_device_cache
    assert _integration("accelerate").enabled


def test_a_seam_that_vanished_is_skipped(monkeypatch, recwarn):
    import accelerate.big_modeling

    monkeypatch.delattr(accelerate.big_modeling, "dispatch_model")
    _module("accelerate").enable()
    assert _integration("accelerate").status()["skipped"] == ["accelerate.big_modeling.dispatch_model"]
    (w,) = [w for w in recwarn if issubclass(w.category, integrations.IntegrationWarning)]
    assert "does not exist" in str(w.message)


def test_the_static_survey_agrees_with_the_live_match():
    for name in NAMES:
        integ = _integration(name)
        live = [(m.seam.name, m.adapter and m.adapter.name) for m in integ.match()]
        static = [(m.seam.name, m.adapter and m.adapter.name) for m in integ.survey()]
        assert live == static, name


def test_an_absent_adapter_matches_only_where_the_seam_does_not_exist(tmp_path, monkeypatch):
    """A release older than the code a seam fixes: its adapter is the seam's absence, matched
    live and statically when the module exists and the attribute does not."""
    package = tmp_path / "arfake"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("def present():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    absent = (_seams.Adapter("older: none", None, absent=True),)
    integ = _seams.Integration(
        "fake",
        "arfake-dist",
        ">=0",
        [
            _seams.Seam("arfake.mod", "missing", adapters=absent),
            _seams.Seam("arfake.mod", "present", adapters=absent),
            _seams.Seam("arfake.nomodule", "missing", adapters=absent),
        ],
    )
    for how, matches in (
        ("live", integ.match()),
        ("static", integ.survey()),
        ("root", integ.survey(str(tmp_path))),
    ):
        missing, present, no_module = matches
        assert missing.adapter is not None and missing.adapter.name == "older: none", how
        assert present.adapter is None and "exists" in present.reason, (how, present.reason)
        assert no_module.adapter is None, (how, no_module.reason)


def test_env_imports_none_of_the_libraries():
    """``accelreg env`` reads the libraries' sources; it imports none of them (a ``find_spec``
    of a dotted name used to import peft, and with it transformers and bitsandbytes)."""
    code = (
        "import contextlib, io, json, sys\n"
        "from accelreg.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['env', '--json'])\n"
        "libs = ('transformers', 'accelerate', 'peft', 'deepspeed', 'bitsandbytes', 'kernels')\n"
        "print(json.dumps([rc, sorted(m for m in libs if m in sys.modules)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, []], proc.stdout


def test_hub_kernels_support_asks_the_kernels_library():
    from accelreg.integrations.transformers import hub_kernels_support

    try:
        import kernels  # noqa: F401
    except ImportError:  # not installed, or not importable with this huggingface_hub
        assert hub_kernels_support("cuda") is False  # nothing to run kernels with
        return
    assert hub_kernels_support("cuda") is True  # every kernels release lists cuda (0.10 has no cpu)
    assert hub_kernels_support("accelreg-no-such-type") is False


@pytest.mark.parametrize("where", ["last seam", "on_enable"])
def test_a_failure_half_way_rolls_back_every_holder(monkeypatch, where):
    integ = _integration("accelerate")
    if where == "last seam":
        seams = list(integ.seams)

        def broken(original):
            raise RuntimeError("make failed")

        seams[-1] = replace(seams[-1], make=broken)
        monkeypatch.setattr(integ, "seams", seams)
    else:

        def broken():
            raise RuntimeError("make failed")

        monkeypatch.setattr(integ, "on_enable", broken)
    snap = Snapshot()
    with pytest.raises(RuntimeError, match="make failed"):
        integ.enable()
    assert not integ.enabled
    assert snap.diff() == []


# -- threads ------------------------------------------------------------------------------
def test_concurrent_enable_and_disable_end_consistent():
    snap = Snapshot()
    barrier = threading.Barrier(16)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            barrier.wait()
            for _ in range(6):
                mod = _module(rng.choice(NAMES))
                mod.enable() if rng.random() < 0.55 else mod.disable()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for name in NAMES:
        expected = "patched" if _integration(name).enabled else "restored"
        assert snap.state(name) == expected, name
        assert len(_integration(name)._installed) in (0, len(snap.holders(name)))
    integrations.uninstall()
    assert snap.diff() == []


# -- behaviour through install() on this CPU machine --------------------------------------
GPT2_KW = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 64}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny GPT-2 (tied wte/lm_head) and a tiny 12-layer Llama, saved once."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**GPT2_KW)).save_pretrained(root / "gpt2")
    llama = LlamaConfig(
        num_hidden_layers=12,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=100,
        max_position_embeddings=32,
    )
    LlamaForCausalLM(llama).save_pretrained(root / "llama")
    return root


@pytest.fixture
def installed():
    assert accelreg.install() == list(NAMES)
    yield


def _gpt2(models, **kwargs):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(models / "gpt2", **kwargs)


@pytest.fixture(scope="module")
def stock_tied_disk_offload(models, tmp_path_factory):
    """Why this transformers, stock, cannot load the tied wte/lm_head pair offloaded to disk
    (4.57.6 and 5.3.0: ``KeyError: 'lm_head.weight'``), or ``None`` where it loads it right. The
    disk-offload tests check accelreg's planning on top of upstream's offload: where upstream's
    own load fails they cannot pass, with accelreg or without."""
    assert not any(_integration(n).enabled for n in NAMES)
    ids = torch.tensor([[1, 2, 3]])
    reference = _gpt2(models, device_map="cpu")(ids).logits
    tied_on_disk = _gpt2_map(**{"transformer.wte": "disk", "lm_head": "disk"})
    try:
        model = _gpt2(
            models, device_map=tied_on_disk, offload_folder=tmp_path_factory.mktemp("stock-offload")
        )
        got = model(ids).logits
    except Exception as exc:  # noqa: BLE001 - the outcome is the answer
        return f"{type(exc).__name__}: {exc}"
    return None if torch.equal(got, reference) else "the logits differ from the cpu load's"


def _needs_disk_offload(why):
    if why is not None:
        pytest.skip(
            f"transformers {transformers.__version__}, stock, fails to load a tied pair offloaded to "
            f"disk ({why}); the disk-offload tests build on upstream's own offload"
        )


@pytest.mark.parametrize("device_map", [0, {"": 0}], ids=["int", "dict-int"])
def test_int_device_map_without_an_accelerator_is_a_device_error(models, installed, device_map):
    with pytest.raises(DeviceError) as info:
        _gpt2(models, device_map=device_map)
    message = str(info.value)
    assert "no accelerator is available" in message and "available: cpu" in message
    assert "cuda:0" not in message


def test_cuda_device_map_on_a_cpu_machine_is_refused(models, installed):
    with pytest.raises(DeviceError, match=r"cuda is not available .*; available: cpu$"):
        _gpt2(models, device_map="cuda")


@needs_check_and_set
def test_cuda_is_refused_not_remapped_when_another_backend_is_current(installed, monkeypatch):
    """Two scripted hpu devices are current: ``"cuda"`` is an error naming them (the user
    asked for a backend that is not here); ints and LOCAL_RANK resolve on hpu."""
    import transformers.modeling_utils as mu

    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("hpu", 2, priority=100)), "fakeplugin_hpu")
    for device_map in ("cuda", "cuda:0", torch.device("cuda", 0), {"": "cuda"}):
        with pytest.raises(DeviceError, match=r"cuda is not available .*available: hpu:0, hpu:1, cpu"):
            mu.check_and_set_device_map(device_map)
    assert mu.check_and_set_device_map(0) == {"": "hpu:0"}
    assert mu.check_and_set_device_map("hpu") == {"": "hpu:1"}  # LOCAL_RANK, not only for "cuda"
    assert mu.check_and_set_device_map({"": 1, "lm_head": "disk"}) == {"": "hpu:1", "lm_head": "disk"}


def test_cpu_device_map_loads(models, installed, monkeypatch):
    import transformers.modeling_utils as mu

    import accelreg.resolution

    asked = []
    resolve = accelreg.resolution.resolve
    monkeypatch.setattr(
        accelreg.resolution, "resolve", lambda spec=None, **kw: asked.append(spec) or resolve(spec, **kw)
    )
    model = _gpt2(models, device_map="cpu")
    # resolved through the registry (5.x: check_and_set_device_map; 4.57: _get_device_map)
    assert "cpu" in [str(a) for a in asked]
    seam = getattr(mu, "check_and_set_device_map", None) or mu._get_device_map
    assert _seams.original(seam) is not seam
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)


def _covered(device_map, name):
    while True:
        if name in device_map:
            return device_map[name]
        if not name:
            return None
        name = name.rpartition(".")[0]


def test_auto_is_planned_by_accelreg_and_keeps_tied_weights_together(
    stock_tied_disk_offload, models, installed, monkeypatch, tmp_path
):
    _needs_disk_offload(stock_tied_disk_offload)
    calls = []
    plan = accelreg.plan_device_map

    def spy(model, max_memory=None, **kwargs):
        calls.append((dict(max_memory), kwargs))
        return plan(model, max_memory, **kwargs)

    monkeypatch.setattr(accelreg, "plan_device_map", spy)
    model = _gpt2(
        models, device_map="auto", max_memory={"cpu": "450KB", "disk": "10GB"}, offload_folder=tmp_path
    )
    assert len(calls) == 1
    budgets, kwargs = calls[0]
    assert budgets == {"cpu": 450_000, "disk": 10_000_000_000} and kwargs["strategy"] == "auto"
    device_map = model.hf_device_map
    assert set(device_map.values()) == {"cpu", "disk"}  # the budget forces an offload
    for name, _ in model.named_parameters(remove_duplicate=False):
        assert _covered(device_map, name) is not None, name
    assert _covered(device_map, "transformer.wte.weight") == _covered(device_map, "lm_head.weight")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)


def _gpt2_map(**overrides):
    device_map = {
        "transformer.wte": "cpu",
        "transformer.wpe": "cpu",
        "transformer.h.0": "cpu",
        "transformer.h.1": "cpu",
        "transformer.ln_f": "cpu",
        "lm_head": "cpu",
    }
    device_map.update(overrides)
    return {k: v for k, v in device_map.items() if v is not None}


def test_user_map_splitting_a_tied_pair_is_refused(models, installed, tmp_path):
    with pytest.raises(DeviceMapError) as info:
        _gpt2(models, device_map=_gpt2_map(lm_head="disk"), offload_folder=tmp_path)
    (violation,) = info.value.violations
    assert "tied group" in violation and "lm_head.weight on disk" in violation
    assert "transformer.wte.weight on cpu" in violation


def test_user_map_missing_a_module_is_refused(models, installed):
    with pytest.raises(DeviceMapError) as info:
        _gpt2(models, device_map=_gpt2_map(**{"transformer.h.1": None}))
    (violation,) = info.value.violations
    assert "covered by no key" in violation and "transformer.h.1.attn.c_attn.weight" in violation


def test_a_valid_user_map_loads(models, installed, monkeypatch):
    checked = []
    check = accelreg.check_device_map
    monkeypatch.setattr(
        accelreg, "check_device_map", lambda m, d, *a, **k: checked.append(d) or check(m, d, *a, **k)
    )
    model = _gpt2(models, device_map=_gpt2_map())
    assert checked == [_gpt2_map()]
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@needs_check_and_set
def test_expand_device_map_matches_the_longest_dotted_prefix(installed):
    import transformers.modeling_utils as mu

    params = ["model.layers.1.w", "model.layers.10.w", "model.layers.11.w", "lm_head.weight"]
    device_map = {"model.layers.1": "disk", "": "cpu"}
    assert mu.expand_device_map(device_map, params) == {
        "model.layers.1.w": "disk",
        "model.layers.10.w": "cpu",  # upstream: "disk" (an unanchored regex match)
        "model.layers.11.w": "cpu",
        "lm_head.weight": "cpu",
    }
    with pytest.raises(DeviceMapError, match=re.escape("does not cover 'lm_head.weight'")):
        mu.expand_device_map({"model.layers": "cpu"}, ["model.layers.0.w", "lm_head.weight"])
    assert mu.expand_device_map(None, ["a.b"]) == {"a.b": "cpu"}


def test_layer_1_on_disk_does_not_take_layer_10_with_it(models, installed, tmp_path):
    from transformers import LlamaForCausalLM

    device_map = {f"model.layers.{i}": "disk" if i == 1 else "cpu" for i in range(12)}
    device_map.update(
        {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    )
    model = LlamaForCausalLM.from_pretrained(models / "llama", device_map=device_map, offload_folder=tmp_path)
    layers = model.model.layers
    assert layers[1].mlp.up_proj.weight.device.type == "meta"  # offloaded to disk
    for i in (0, 10, 11):
        assert layers[i].mlp.up_proj.weight.device.type == "cpu", i
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 100)
    # a map whose keys nest is refused with a clear error. Upstream cannot load it either:
    # accelerate's dispatch_model then fails with "weight is on the meta device, we need a
    # `value` to put in on cpu" (transformers 5.24, accelerate 1.15, checked by hand)
    with pytest.raises(DeviceMapError, match=r"covered by 2 keys \('', 'model.layers.1'\)"):
        LlamaForCausalLM.from_pretrained(
            models / "llama", device_map={"": "cpu", "model.layers.1": "disk"}, offload_folder=tmp_path
        )


@pytest.mark.parametrize("bits", [8, 4])
def test_bitsandbytes_load_on_cpu_attaches_placement_hooks(models, installed, monkeypatch, bits):
    import bitsandbytes.nn.modules
    from transformers import BitsAndBytesConfig

    from accelreg import placement

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: False, raising=False)
    if bits == 8:
        config, cls = BitsAndBytesConfig(load_in_8bit=True), bitsandbytes.nn.Linear8bitLt
    else:
        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
        cls = bitsandbytes.nn.Linear4bit
    model = _gpt2(models, quantization_config=config, device_map="auto")
    quantized = {n for n, m in model.named_modules() if isinstance(m, cls)}
    attached = {n for n, m in model.named_modules() if placement.hooks._STATE in m.__dict__}
    assert len(quantized) == 8 and attached == quantized
    x = torch.tensor([[1, 2, 3]])
    logits = model(x).logits
    assert logits.shape == (1, 3, 1000) and bool(logits.isfinite().all())
    # a quantized state-dict round trip goes through the hooks (seed 000 crashed here on CPU)
    placement.load_events(model, clear=True)
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    events = placement.load_events(model)
    assert {e["module"] for e in events} == quantized
    assert {e["quant_method"] for e in events} == {f"bnb_{bits}bit"}
    assert {e["device"] for e in events} == {"cpu"}
    assert torch.allclose(model(x).logits, logits)


def test_bitsandbytes_default_device_map_comes_from_the_registry(installed):
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    quantizer = Bnb8BitHfQuantizer(BitsAndBytesConfig(load_in_8bit=True))
    assert quantizer.update_device_map(None) == {"": "cpu"}
    assert quantizer.update_device_map({"": "cpu"}) == {"": "cpu"}
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    assert quantizer.update_device_map(None) == {"": "xpu:0"}
    accelreg.reset()
    accelreg.register(plugin(spec("fakeipu", 2, priority=100, device_type="ipu")), "fakeplugin_ipu")
    with pytest.raises(PlacementError, match=r"bitsandbytes .* cannot run on ipu \(it supports .*cpu"):
        quantizer.update_device_map(None)


def test_peft_infer_device_is_the_registry_device(installed, monkeypatch):
    import peft.peft_model
    import peft.utils
    import peft.utils.other
    import peft.utils.save_and_load

    holders = (peft.utils.other, peft.utils, peft.utils.save_and_load, peft.peft_model)
    assert {h.infer_device() for h in holders} == {"cpu"}
    assert all(_seams.original(h.infer_device) is not h.infer_device for h in holders)
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    # peft's own form, a device type (callers compare it with tensor.device.type); upstream
    # answers cuda first and knows no musa/sdaa/hpu. The indexed device is accelreg.resolve().
    assert {h.infer_device() for h in holders} == {"xpu"}
    assert str(accelreg.resolve()) == "xpu:1"


def test_accelerate_memory_and_default_device_follow_the_registry(installed, monkeypatch):
    import accelerate.utils
    from accelerate.state import PartialState

    assert set(accelerate.utils.get_max_memory()) == {"cpu"}
    # a given max_memory keeps accelerate's contract: int keys as they are (planning for
    # another machine), sorted ints first, values parsed
    assert accelerate.utils.get_max_memory({"cpu": "1GB", 0: "1GB", 2: "2GB"}) == {
        0: 1_000_000_000,
        2: 2_000_000_000,
        "cpu": 1_000_000_000,
    }
    monkeypatch.setenv("LOCAL_RANK", "1")
    accelreg.reset()
    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    memory = accelerate.utils.get_max_memory()
    assert list(memory) == [0, 1, "cpu"] and memory[0] == 1 << 30 and memory[1] == 2 << 30
    assert accelerate.utils.get_max_memory({"xpu:1": "1GB", 0: "2GB", "cpu": "1GB"}) == {
        0: 2_000_000_000,
        1: 1_000_000_000,
        "cpu": 1_000_000_000,
    }
    with pytest.raises(
        DeviceError, match="is a cuda device, but accelerate plans for the current backend xpu"
    ):
        accelerate.utils.get_max_memory({"cuda:0": "1GB"})
    # accelerate's form: the backend the registry chose, no index (the runtime's current one)
    assert inspect.getattr_static(PartialState, "default_device").fget(None) == torch.device("xpu")


# -- accelreg env -------------------------------------------------------------------------
_AFTER_INSTALL = textwrap.dedent(
    """
    import json, sys
    import accelreg
    from accelreg import cli
    names = accelreg.install()
    early = sorted(m for m in ("transformers", "accelerate", "peft", "deepspeed") if m in sys.modules)
    import accelerate, transformers.modeling_utils, peft
    report = cli.env_report()
    print("JSON" + json.dumps({"names": names, "early": early, "report": report,
                               "deepspeed_imported": "deepspeed" in sys.modules}))
    cli.main(["env"])
    """
)


@pytest.fixture(scope="module", autouse=True)
def env_runs(tmp_path_factory):
    """``accelreg env`` (text, ``--json``) in fresh processes and a process that calls
    ``install()``, started together when the module starts (they take seconds each)."""
    work = tmp_path_factory.mktemp("env")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELREG_", "LOCAL_RANK"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["XDG_CONFIG_HOME"] = str(work / "xdg")
    commands = {
        "text": ["-m", "accelreg", "env"],
        "json": ["-m", "accelreg", "env", "--json"],
        "install": ["-c", _AFTER_INSTALL],
    }
    procs = {
        key: subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=work,
            env=env,
        )
        for key, args in commands.items()
    }
    results = {}

    def result(key):
        if key not in results:
            out, err = procs[key].communicate(timeout=180)
            results[key] = subprocess.CompletedProcess(commands[key], procs[key].returncode, out, err)
        return results[key]

    yield result
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_env_in_a_fresh_process_says_what_install_would_do(env_runs):
    text, data = env_runs("text"), env_runs("json")
    assert text.returncode == 0, text.stderr
    assert data.returncode == 0, data.stderr
    report = json.loads(data.stdout)
    assert "per process" in report["integrations_scope"] and "none is enabled" in report["integrations_scope"]
    by_name = {item["name"]: item for item in report["integrations"]}
    assert list(by_name) == list(NAMES)
    section = text.stdout.split("\nintegrations: ", 1)[1]
    assert section.startswith("per process, and none is enabled in this one")
    for name in NAMES:
        item = by_name[name]
        integ = _integration(name)
        version = metadata.version(integ.distribution)
        assert item["library"] == integ.distribution and item["version"] == version
        # a fresh install may bring a release newer than the tested list: env says which it is
        tested = integ.tested(version)
        assert item["supported"] == integ.supported and item["in_range"] is tested
        assert item["all_match"] is True and item["skipped"] == []
        assert item["enabled"] is False and item["pending"] is False
        assert item["install"].startswith("install() would enable it")
        assert f"{name}: not enabled ({integ.distribution} {version})" in section
        listed = "in the tested list" if tested else "not in the tested list"
        assert f"{integ.distribution} {version}: {listed}; all seams match" in section
    assert "install() would enable it (when transformers.modeling_utils is imported)" in section
    assert "DeepSpeed accelerator cpu" in section and "agrees with accelreg's cpu" in section


def test_env_after_install_in_the_same_process(env_runs):
    result = env_runs("install")
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("JSON"))
    out = json.loads(line[4:])
    assert out["names"] == list(NAMES)
    assert out["early"] == []  # install() imports none of the libraries
    report = out["report"]
    assert report["integrations_scope"] == "as enabled in this process"
    by_name = {item["name"]: item for item in report["integrations"]}
    for name in ("accelerate", "transformers", "peft"):
        assert by_name[name]["enabled"] is True and by_name[name]["install"] == "enabled in this process"
        assert "holders patched" in by_name[name]["note"]
    text = result.stdout.split("\nintegrations: ", 1)[1]
    assert f"accelerate: enabled (accelerate {metadata.version('accelerate')})" in text
    if out["deepspeed_imported"]:
        assert by_name["deepspeed"]["enabled"] is True
    else:  # waiting for `import deepspeed`
        assert by_name["deepspeed"]["enabled"] is False and by_name["deepspeed"]["pending"] is True
        assert by_name["deepspeed"]["install"] == "install() was called: enabled when deepspeed is imported"
        assert f"deepspeed: pending (deepspeed {metadata.version('deepspeed')})" in text


def test_env_names_an_untested_release_whose_seams_all_match(monkeypatch, capsys):
    from accelreg import cli

    _fake_version(monkeypatch, "peft", "0.30.0")
    assert cli.main(["env", "--json"]) == 0
    item = {i["name"]: i for i in json.loads(capsys.readouterr().out)["integrations"]}["peft"]
    assert item["version"] == "0.30.0" and item["in_range"] is False and item["all_match"] is True
    assert item["install"] == "install() would enable it (when peft is imported)"
    assert cli.main(["env"]) == 0
    assert "peft 0.30.0: not in the tested list; all seams match" in capsys.readouterr().out


def test_status_tracks_this_process():
    before = {i["name"]: i for i in integrations.status()}
    assert not any(i["enabled"] or i["pending"] for i in before.values())
    _module("peft").enable()
    after = {i["name"]: i for i in integrations.status()}
    assert after["peft"]["enabled"] is True and after["peft"]["install"] == "enabled in this process"
    assert after["peft"]["note"].endswith("holders patched")
    assert after["accelerate"]["enabled"] is False


def test_install_prepares_deepspeed_without_importing_it_and_uninstall_cancels():
    """install() registers DeepSpeed's accelerator alignment for the moment DeepSpeed's
    accelerator module is imported; it imports none of the libraries itself."""
    from accelreg.testing import run_python

    code = textwrap.dedent(
        """
        import json, sys
        import accelreg
        from accelreg.integrations import _postimport
        REAL = "deepspeed.accelerator.real_accelerator"
        names = accelreg.install()
        before = _postimport.pending(REAL)
        loaded = [m for m in ("transformers", "accelerate", "peft", "deepspeed", "ray", "lightning",
                              "lightning_fabric", "pytorch_lightning") if m in sys.modules]
        accelreg.integrations.uninstall()
        print(json.dumps({"names": names, "pending": before, "after": _postimport.pending(REAL),
                          "loaded": loaded}))
        """
    )
    out = run_python(code, name=None).value
    assert out == {
        "names": list(NAMES),
        "pending": True,
        "after": False,
        "loaded": [],
    }, out


# -- the patch-free path and upstream's contracts -------------------------------------------
def test_device_map_for_plans_without_patching_from_a_folder_a_config_a_type_or_a_meta_model(models):
    from transformers import GPT2Config, GPT2LMHeadModel

    accelreg.register(plugin(spec("xpu", 2, priority=100)), "fakeplugin_xpu")
    budgets = {"xpu:0": "300KB", "xpu:1": "10MB", "cpu": "1GB"}
    config = GPT2Config(**GPT2_KW)
    with torch.device("meta"):
        meta = GPT2LMHeadModel(config)
    maps = [
        accelreg.device_map_for(given, budgets)
        for given in (models / "gpt2", str(models / "gpt2"), config, meta)
    ]
    assert all(m == maps[0] for m in maps), maps
    device_map = maps[0]
    assert set(device_map.values()) == {"xpu:0", "xpu:1"}, device_map  # qualified, the registry's
    assert _covered(device_map, "transformer.wte.weight") == _covered(device_map, "lm_head.weight")
    accelreg.check_device_map(meta, device_map, budgets)
    assert not any(_integration(n).enabled for n in NAMES)  # nothing was patched
    assert set(accelreg.device_map_for("gpt2").values()) <= {"xpu:0", "xpu:1", "cpu"}  # a model type
    with pytest.raises(
        ValueError, match=r"is not a model type of transformers .*, nor a config\.json or a folder"
    ):
        accelreg.device_map_for("no-such-model-type")


def test_offload_folder_counts_as_a_disk_budget(stock_tied_disk_offload, models, installed, tmp_path):
    """transformers' own opt-in to disk offload: without a "disk" budget, offload_folder lets
    the planner use the disk (upstream's planner does the same)."""
    _needs_disk_offload(stock_tied_disk_offload)
    model = _gpt2(models, device_map="auto", max_memory={"cpu": "450KB"}, offload_folder=tmp_path)
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    assert any(tmp_path.iterdir())
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)
    with pytest.raises(DeviceMapError):  # no offload_folder: no disk, and the model does not fit
        _gpt2(models, device_map="auto", max_memory={"cpu": "450KB"})


def test_hf_device_map_keeps_the_users_own_values(models, installed, tmp_path):
    device_map = _gpt2_map(**{"transformer.h.1": "disk"})
    device_map["transformer.h.0"] = torch.device("cpu")
    model = _gpt2(models, device_map=device_map, offload_folder=tmp_path)
    assert model.hf_device_map == device_map  # upstream keeps what the user wrote
