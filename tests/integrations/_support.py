"""Helpers of the integration tests (no tests here): the libraries, snapshots of every holder
of a seam, fake versions, the tiny GPT-2's device maps.

Importing it skips the importing module where a library is not installed (the tests need all
of torch, transformers, accelerate, peft, DeepSpeed and bitsandbytes). It imports none of them:
a test imports what it uses when it runs, so collecting the suite (once per pytest-xdist
worker) does not pay for DeepSpeed and peft.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

import accelreg.integrations as integrations
from accelreg.integrations._machinery import seams as _seams

LIBRARIES = ("torch", "transformers", "accelerate", "peft", "deepspeed", "bitsandbytes")
_missing = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
if _missing:
    pytest.skip(f"the integration tests need {', '.join(_missing)} (not installed)", allow_module_level=True)

#: Every built-in row of the integrations table whose library is installed here. vLLM is not in
#: the default environment (its own layer: ``nox -s vllm`` runs these tests against it too).
NAMES = tuple(
    name
    for name, trigger in integrations.table.BUILTIN.items()
    if importlib.util.find_spec(trigger.split(".")[0]) is not None
)


def _defines(module: str, name: str) -> bool:
    """Whether ``module``'s source defines ``name`` (read, not imported: collection imports no
    more of transformers than the tests do)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return False
    path = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    return path.is_file() and f"def {name}(" in path.read_text()


#: Where from_pretrained normalises device_map inline (transformers 4.57: no
#: check_and_set_device_map, and expand_device_map matches exact prefixes itself), the tests of
#: those two seams have nothing to call: guarded by the seam, not the version.
needs_check_and_set = pytest.mark.skipif(
    not _defines("transformers.integrations.accelerate", "check_and_set_device_map"),
    reason=f"transformers {metadata.version('transformers')} normalises device_map inline in from_pretrained "
    "(no check_and_set_device_map seam)",
)


PREFIXES = (
    "safetensors",
    "transformers",
    "accelerate",
    "peft",
    "deepspeed",
    "ray",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "vllm",
)
ROOT = Path(__file__).resolve().parents[2]  # the checkout


def _module(name):
    """The module holding integration ``name``'s ``INTEGRATION`` (its table row's folder)."""
    return importlib.import_module(integrations.table.row(name).module)


def _integration(name):
    return _module(name).INTEGRATION


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
        self.seams = {}  # (integration, seam module.name) -> (owner, attr, original)
        self.classes = {}
        for n in names:
            for seam, owner, attr in _owners(_integration(n)):
                # Fabric's and the Trainer's DeepSpeedStrategy share a seam name: the module tells them apart
                self.seams[(n, f"{seam.module}.{seam.name}")] = (
                    owner,
                    attr,
                    inspect.getattr_static(owner, attr),
                )
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


def _fake_version(monkeypatch, distribution, version):
    """The integrations see ``distribution`` at ``version`` (``seams.installed_version``)."""
    from accelreg.integrations._machinery import seams

    real = seams.installed_version

    def version_of(dist):
        return version if dist == distribution else real(dist)

    monkeypatch.setattr(seams, "installed_version", version_of)


GPT2_KW = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 64}


def _gpt2(models, **kwargs):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(models / "gpt2", **kwargs)


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


def _covered(device_map, name):
    while True:
        if name in device_map:
            return device_map[name]
        if not name:
            return None
        name = name.rpartition(".")[0]


def _needs_disk_offload(why):
    if why is not None:
        pytest.skip(
            f"transformers {metadata.version('transformers')}, stock, fails to load a tied pair offloaded to "
            f"disk ({why}); the disk-offload tests build on upstream's own offload"
        )
