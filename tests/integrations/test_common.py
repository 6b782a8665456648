"""The shape every integration shares, against the real libraries (no mocks of them).

* ``enable()``/``disable()`` of transformers, accelerate, peft and DeepSpeed: every holder of a
  seam (the defining module and every module that imported it by name) is patched, and
  ``disable()`` puts back the identical objects — compared by identity against a snapshot of
  ``vars()`` of every module of the four libraries and of every class a seam lives on;
  idempotence, the context managers, ``install()``/``uninstall()``, late by-name importers.
* The seam is the guard, not the version: an untested release whose seams all match is enabled;
  the static survey agrees with the live match; an absent adapter; a failure half-way through
  rolls back every holder.
* 16 threads enabling and disabling concurrently end all-patched or all-restored.
* ``accelreg env`` (text and ``--json``): the integrations section, in a fresh process and in
  one that called ``install()``; ``status()`` of this process.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import types
from dataclasses import replace
from importlib import metadata

import pytest

import accelreg
import accelreg.integrations as integrations
from accelreg.errors import IntegrationError
from accelreg.integrations._machinery import seams as _seams

from ._support import NAMES, ROOT, Snapshot, _fake_version, _integration, _module, _owners

#: At least this many holders per integration (the defining modules plus by-name importers).
MIN_HOLDERS = {
    "accelerate": 12,
    "transformers": 5,
    "transformers_training": 6,  # _setup_devices on its class, the precision checks and their importers
    "transformers_trainer": 2,  # the Trainer's two random-state methods
    "transformers_pipelines": 1,  # Pipeline.__init__
    "peft": 6,
    "deepspeed": 1,
    "ray": 5,
    "ray_train": 5,
    "lightning": 14,  # 2.2 has no model_parallel strategies (2.6: 16)
    "lightning_fabric": 10,  # (2.6: 12)
    "pytorch_lightning": 4,
    "vllm": 1,  # vllm.platforms itself (no module imports the function by name)
    "accelerate_launch": 14,  # the launch helpers re-exported by accelerate.utils and held by the command
    "torch_accelerator": 1,
    # safetensors, its Rust module, safetensors.torch and the libraries' by-name importers of safe_open
    # (transformers, accelerate, peft); _safe_open_handle (0.6+) in safetensors and its Rust module
    "safetensors": 6,
    "torch_sharded_tensor": 1,  # the class that holds __torch_function__
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


UNTESTED = {
    "accelerate": "1.17.0",
    "transformers": "5.26.0",
    "transformers_training": "5.26.0",
    "transformers_trainer": "5.26.0",
    "transformers_pipelines": "5.26.0",
    "peft": "0.23.0",
    "deepspeed": "0.20.0",
    "ray": "2.61.0",
    "ray_train": "2.61.0",
    "lightning": "2.7.0",
    "lightning_fabric": "2.7.0",
    "pytorch_lightning": "2.7.0",
    "vllm": "0.33.0",
    "accelerate_launch": "1.17.0",
    "torch_accelerator": "2.5.0",  # below the tested >=2.6 (a fake version: torch stays as it is)
    "safetensors": "0.9.0",
    "torch_sharded_tensor": "2.14.0",  # above the tested 2.13 (a fake version: torch stays as it is)
}


@pytest.mark.parametrize("name", NAMES)
def test_a_release_outside_the_table_is_named_before_patching_then_matched_by_shape(monkeypatch, name):
    """The conflict report: one warning naming the release and the range, raised before the
    first seam is patched; then the seams are matched by shape, and all of them match."""
    integ = _integration(name)
    _fake_version(monkeypatch, integ.distribution, UNTESTED[name])
    monkeypatch.setattr(_seams, "_reported", set())
    snap = Snapshot()
    patched_when_warned = []

    def seen(message, category=None, *args, **kwargs):
        patched_when_warned.append((str(message), integ.enabled or snap.state(name) != "restored"))

    monkeypatch.setattr(_seams.warnings, "warn", seen)
    _module(name).enable()
    assert integ.enabled and snap.state(name) == "patched"
    [(message, patched)] = patched_when_warned
    assert (
        f"{integ.distribution} {UNTESTED[name]} is outside the releases the {name} integration serves"
        in message
    )
    assert str(integ.releases) in message and patched is False
    status = integ.status()
    assert status["version"] == UNTESTED[name] and status["in_range"] is False
    assert status["conflicts"] and UNTESTED[name] in status["conflicts"][0]
    assert status["all_match"] is True and status["skipped"] == []
    assert f"{integ.distribution} {UNTESTED[name]}: outside the releases it serves" in status["note"]
    _module(name).disable()
    assert snap.diff() == []


def test_strict_mode_refuses_a_release_outside_the_table_and_patches_nothing(monkeypatch, strict):
    integ = _integration("accelerate")
    _fake_version(monkeypatch, integ.distribution, UNTESTED["accelerate"])
    snap = Snapshot()
    with pytest.raises(IntegrationError, match=r"accelerate 1\.17\.0 is outside .* nothing was patched"):
        accelreg.install()
    assert not any(_integration(n).enabled for n in NAMES)
    assert snap.diff() == []


def test_install_on_untested_releases_enables_every_integration(monkeypatch):
    monkeypatch.setattr(_seams, "_reported", set())
    for name in ("transformers", "accelerate"):
        _fake_version(monkeypatch, _integration(name).distribution, UNTESTED[name])
    with pytest.warns(integrations.IntegrationWarning, match="outside the releases") as caught:
        assert accelreg.install() == list(NAMES)
    # one per integration of those libraries (accelerate has two: the library and its command line;
    # transformers four: model loading, TrainingArguments, the Trainer, the pipelines), before
    # anything was patched
    faked = {_integration(n).distribution for n in ("transformers", "accelerate")}
    assert len(caught) == len([n for n in NAMES if _integration(n).distribution in faked]) == 6
    assert all(_integration(n).enabled for n in NAMES)


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
    absent = (_seams.Adapter(">=0", None, absent=True, note="none"),)
    integ = _seams.Integration(
        "fake",
        "arfake-dist",
        "arfake",
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
        assert missing.adapter is not None and missing.adapter.name == ">=0: none", how
        assert present.adapter is None and "exists" in present.reason, (how, present.reason)
        assert no_module.adapter is None, (how, no_module.reason)


@pytest.mark.parametrize("where", ["last seam", "on_enable"])
def test_a_failure_half_way_rolls_back_every_holder(monkeypatch, where):
    integ = _integration("accelerate")
    if where == "last seam":
        seams = list(integ.seams)

        def broken(original):
            raise RuntimeError("make failed")

        # the last seam built from its own ``make`` (the ones after it declare adapters)
        last = max(i for i, seam in enumerate(seams) if not seam.adapters)
        seams[last] = replace(seams[last], make=broken)
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
    assert list(by_name) == integrations.table.names()
    for name in set(by_name) - set(NAMES):  # a host library not installed here (vLLM, outside its layer)
        assert by_name[name]["version"] is None
        assert by_name[name]["install"] == "library not installed: install() skips it"
    section = text.stdout.split("\nintegrations: ", 1)[1]
    assert section.startswith("per process, and none is enabled in this one")
    for name in NAMES:
        item = by_name[name]
        integ = _integration(name)
        version = metadata.version(integ.distribution)
        assert item["library"] == integ.distribution and item["version"] == version
        # a fresh install may bring a release newer than the table: env says which it is
        tested = integ.serves(version)
        assert item["releases"] == str(integ.releases) and item["in_range"] is tested
        assert item["tested"] == dict(integ.tested) and bool(item["conflicts"]) is not tested
        assert item["all_match"] is True and item["skipped"] == []
        assert item["enabled"] is False and item["pending"] is False
        assert item["install"].startswith("install() would enable it")
        assert f"{name}: not enabled ({integ.distribution} {version})" in section
        listed = ("in" if tested else "outside") + f" the releases it serves ({integ.releases})"
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
    out = capsys.readouterr().out
    assert "peft 0.30.0: outside the releases it serves (>=0.17,<0.23); all seams match" in out


def test_status_tracks_this_process():
    before = {i["name"]: i for i in integrations.status()}
    assert not any(i["enabled"] or i["pending"] for i in before.values())
    _module("peft").enable()
    after = {i["name"]: i for i in integrations.status()}
    assert after["peft"]["enabled"] is True and after["peft"]["install"] == "enabled in this process"
    assert after["peft"]["note"].endswith("holders patched")
    assert after["accelerate"]["enabled"] is False
