"""The patch-free path (``device_map_for``): maps valid for whichever accelerator stock dispatch
picks as the main device, the devices this process lacks named, and the extra it needs.

Stock accelerate 1.10-1.14 runs offloaded layers on the first accelerator of the map it is
given, 1.15+ on a hash-ordered pick among the map's accelerators (``tests/emu/
test_patch_free_dispatch.py`` loads the maps across hash seeds); so a map for stock dispatch
keeps the offload headroom on every accelerator it uses (``any_main``).
"""

from __future__ import annotations

import itertools
import json
import textwrap
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

import accelreg
from accelreg.planner import packing, plan
from accelreg.testing import run_python

from .test_planner_properties import problems

ISSUE_BUDGETS = {"npu:0": int(1.15 * 256_000), "npu:1": int(1.15 * 256_000), "cpu": 100_000_000}


def issue_gpt2() -> torch.nn.Module:
    """The model measured in issue 21: tied GPT-2, 4 layers, n_embd 64, vocab 1000."""
    cfg = GPT2Config(n_layer=4, n_embd=64, n_head=2, vocab_size=1000, n_positions=64)
    with torch.device("meta"):
        return GPT2LMHeadModel(cfg)


def holds_for_any_main(p: packing.Problem, targets: tuple[int, ...]) -> bool:
    """Whether ``targets`` obeys the rules with *every* used accelerator as a possible main device."""
    k = p.k
    load = [0] * (k + 2)
    off = disk_layer = 0
    for u, t in enumerate(targets):
        load[t] += p.sizes[u]
        if t == k and (p.cpu is None or not p.cpu_ok[u]):
            return False
        if t == k + 1 and (p.disk is None or not p.disk_ok[u]):
            return False
        if t >= k:
            off = max(off, p.layers[u])
            if t == k + 1:
                disk_layer = max(disk_layer, p.layers[u])
    used = set(targets)
    for d in range(k):
        if load[d] + (off if d in used else 0) > p.caps[d]:
            return False
    if p.cpu is not None and load[k] + disk_layer > p.cpu:
        return False
    return not (p.disk is not None and load[k + 1] > p.disk)


def most_resident_any_main(p: packing.Problem) -> int | None:
    best = None
    for targets in itertools.product(range(p.k + 2), repeat=len(p.sizes)):
        resident = sum(p.sizes[u] for u, t in enumerate(targets) if t < p.k)
        if (best is None or resident > best) and holds_for_any_main(p, targets):
            best = resident
    return best


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.data())
def test_any_main_keeps_the_most_bytes_any_placement_valid_for_every_main_can(p, data):
    p.any_main = True
    best = most_resident_any_main(p)
    try:
        solution = packing.solve(p)
    except packing.NoFit as exc:
        assert exc.gave_up is None, "a few units never exhaust the search"
        assert best is None, f"no fit claimed, but {best} bytes can stay on accelerators"
        return
    assert not packing.validate(p, solution.targets), solution
    assert holds_for_any_main(p, tuple(solution.targets)), solution
    resident = sum(s for s, t in zip(p.sizes, solution.targets, strict=True) if t < p.k)
    assert resident == best, (resident, best, solution)


def test_validate_with_any_main_counts_the_headroom_on_every_used_device():
    p = packing.Problem(
        sizes=[5, 5, 4],
        layers=[5, 5, 4],
        blocks=[False] * 3,
        cpu_ok=[True] * 3,
        disk_ok=[False] * 3,
        caps=[9, 9],
        cpu=100,
        disk=None,
    )
    targets = [0, 1, 2]  # 4 offloaded: device 0 keeps 5 + 4, device 1 keeps 5 + 4
    assert packing.validate(p, targets) == []
    p.any_main = True
    assert packing.validate(p, targets) == []
    p.caps = [9, 8]
    assert packing.validate(p, targets) == ["accelerator 1: 9 > 8"]
    p.any_main = False
    assert packing.validate(p, targets) == []  # only the main device (0) keeps the headroom


def test_the_issue_case_install_path_and_patch_free_path():
    model = issue_gpt2()
    installed = plan(model, ISSUE_BUDGETS)
    assert installed.main_device == "npu:1" and installed.device_map["transformer.wte"] == "npu:0"
    with pytest.raises(accelreg.DeviceMapError, match=r"npu:0: 256\.0 KB placed"):
        accelreg.check_device_map(model, installed.device_map, ISSUE_BUDGETS, any_main=True)

    patch_free = plan(model, ISSUE_BUDGETS, any_main=True)
    assert patch_free.any_main and patch_free.as_dict()["any_main"] is True
    accelreg.check_device_map(model, patch_free.device_map, ISSUE_BUDGETS, any_main=True)
    # whichever accelerator stock picks, listed first the map passes the main-device check
    for device in {v for v in patch_free.device_map.values() if v not in ("cpu", "disk")}:
        lead = next(k for k, v in patch_free.device_map.items() if v == device)
        first = {lead: device, **{k: v for k, v in patch_free.device_map.items() if k != lead}}
        accelreg.check_device_map(model, first, ISSUE_BUDGETS)
    assert {u.place: u.headroom for u in patch_free.places if u.used and u.place.startswith("npu")} == {
        "npu:0": 256_000,
        "npu:1": 256_000,
    }
    assert patch_free.resident < installed.resident  # what it costs here (docs/planner.md)


def test_device_map_for_plans_for_any_main_and_plan_device_map_does_not():
    model = issue_gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # npu is not here: tested below
        patch_free = accelreg.device_map_for(model, ISSUE_BUDGETS)
    assert patch_free == plan(model, ISSUE_BUDGETS, any_main=True).device_map
    assert accelreg.plan_device_map(model, ISSUE_BUDGETS) == plan(model, ISSUE_BUDGETS).device_map
    assert accelreg.plan_device_map(model, ISSUE_BUDGETS) != patch_free


def test_when_nothing_is_offloaded_any_main_changes_nothing():
    model = issue_gpt2()
    roomy = {"npu:0": "1MB", "npu:1": "1MB", "cpu": "1GB"}
    assert plan(model, roomy, any_main=True).device_map == plan(model, roomy).device_map
    assert "cpu" not in plan(model, roomy).device_map.values()


def test_device_map_for_names_the_devices_this_process_lacks_and_why():
    model = issue_gpt2()
    with pytest.warns(RuntimeWarning, match=r"2 device\(s\) this process does not have") as caught:
        accelreg.device_map_for(model, ISSUE_BUDGETS)
    text = str(caught[0].message)
    assert "(npu:0, npu:1: npu is not available here: " in text
    with pytest.warns(RuntimeWarning, match=r"acme:0: no backend called 'acme' is registered here"):
        accelreg.device_map_for(model, {"acme:0": "10MB", "cpu": "1GB"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only devices this process has: no warning
        assert set(accelreg.device_map_for(model, {"cpu": "1GB"}).values()) == {"cpu"}


def test_missing_devices_names_an_index_past_the_count():
    from accelreg.planner.budgets import missing_devices

    assert missing_devices(["cpu", "disk"]) == {}
    assert "not available here" in missing_devices(["npu:0"])["npu:0"]


BLOCKER = """
import importlib.abc, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {HIDDEN}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Hide())
"""


def test_without_transformers_device_map_for_names_the_extra():
    code = BLOCKER.format(HIDDEN='{"transformers"}') + textwrap.dedent(
        """
        import json, accelreg
        try:
            accelreg.device_map_for("gpt2", {"cpu": "1GB"})
        except ModuleNotFoundError as exc:
            print(json.dumps([exc.name, str(exc)]))
        """
    )
    name, message = run_python(code, name=None).value
    assert name == "transformers"
    assert "pip install 'accelreg[hf]'" in message and "'gpt2' needs transformers" in message


def test_without_transformers_accelreg_plan_names_the_extra():
    code = BLOCKER.format(HIDDEN='{"transformers"}') + textwrap.dedent(
        """
        import sys
        from accelreg.cli import main
        sys.exit(main(["plan", "gpt2", "--max-memory", "cpu=1GB"]))
        """
    )
    result = run_python(code, name=None, check=False)
    assert result.returncode == 1, result
    assert "pip install 'accelreg[hf]'" in result.stderr and "Traceback" not in result.stderr


def test_plan_json_carries_any_main():
    model = issue_gpt2()
    data = json.loads(json.dumps(plan(model, ISSUE_BUDGETS).as_dict()))
    assert data["any_main"] is False


def test_accelreg_plan_notes_the_devices_this_process_lacks(capsys):
    from accelreg.cli import main

    args = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "note: this process has no npu:0, npu:1 (npu is not available here: torch_npu is not installed): "
        "the map is for a machine that has them"
    ) in out
    assert main([*args, "--json"]) == 0
    missing = json.loads(capsys.readouterr().out)["missing_devices"]
    assert set(missing) == {"npu:0", "npu:1"}
    assert main(["plan", "gpt2", "--max-memory", "cpu=2GB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing_devices"] == {}


def test_accelreg_plan_patch_free_is_the_map_device_map_for_returns(capsys):
    from accelreg.cli import main

    args = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]
    assert main([*args, "--patch-free", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert data["device_map"] == accelreg.device_map_for(
            "gpt2", {"npu:0": "250MB", "npu:1": "250MB", "cpu": "1GB"}
        )
    assert data["any_main"] is True
    assert main([*args, "--patch-free"]) == 0
    out = capsys.readouterr().out
    assert (
        "each of npu:0, npu:1 keeps the headroom to run the offloaded layers (stock dispatch picks one)"
        in out
    )
    assert "412.7 MB of 497.8 MB" in out  # 441.1 MB for install() (docs/planner.md)
