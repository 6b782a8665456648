"""plan_device_map / check_device_map: budgets, strategies, ties, buffers, headroom, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import accelreg
from accelreg import registry
from accelreg.planner import plan
from accelreg.planner.budgets import RESERVE, parse_budgets

from ._fakes import plugin, spec
from ._planner_support import violations


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)


class Stack(nn.Module):
    """embed -> blocks -> norm -> head (head tied to embed)."""

    _no_split_modules = ("Block",)

    def __init__(self, n: int = 6, width: int = 8, vocab: int = 16, tie: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(n))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight


def stack(**kw) -> Stack:
    with torch.device("meta"):
        return Stack(**kw)


BLOCK = 4 * (2 * (8 * 8 + 8))  # 576 bytes
EMBED = 4 * 16 * 8  # 512
NORM = 4 * 16  # 64


def places(device_map, model):
    """Place of every parameter/buffer name of ``model`` under ``device_map``."""
    out = {}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    for name in names:
        keys = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
        assert len(keys) == 1, (name, keys)
        out[name] = device_map[keys[0]]
    return out


# -- budgets ----------------------------------------------------------------------------------
def test_fully_qualified_keys_of_absent_backends_plan_without_the_registry(monkeypatch):
    def no_registry():
        raise AssertionError("the registry was consulted")

    monkeypatch.setattr(registry, "get", no_registry)
    model = stack()
    device_map = accelreg.plan_device_map(model, {"npu:0": "2KB", "npu:1": "3KB", "cpu": "1GB"})
    assert set(device_map.values()) <= {"npu:0", "npu:1"}
    assert {"npu:0", "npu:1"} <= set(device_map.values())


def test_int_keys_resolve_through_the_registry():
    accelreg.register(plugin(spec("cuda", 2)), "fakecuda")
    model = stack()
    device_map = accelreg.plan_device_map(model, {0: 2000, 1: 3000, "cpu": 10**6})
    assert set(device_map.values()) == {"cuda:0", "cuda:1"}
    assert violations(model, device_map, {"cuda:0": 2000, "cuda:1": 3000, "cpu": 10**6}) == ()
    # ints in a map given to the checker resolve the same way
    as_ints = {k: int(v.split(":")[1]) for k, v in device_map.items()}
    assert violations(model, as_ints, {0: 2000, 1: 3000, "cpu": 10**6}) == ()


def test_int_keys_without_an_accelerator_raise_device_error():
    with pytest.raises(accelreg.DeviceError, match="no accelerator is available"):
        accelreg.plan_device_map(stack(), {0: "1GB", "cpu": "1GB"})


def test_budget_keys_are_normalised_and_checked():
    b = parse_budgets({"xpu:1": "1KB", torch.device("xpu", 0): 500, "cpu:0": "1MiB", "disk": 7})
    assert b.accelerators == (("xpu:0", 500), ("xpu:1", 1000))  # by index within a backend
    assert b.cpu == 2**20 and b.disk == 7
    with pytest.raises(ValueError, match="twice"):
        parse_budgets({"cpu": 1, "cpu:0": 2})
    with pytest.raises(ValueError, match="not a place"):
        parse_budgets({"meta": 1})
    with pytest.raises(TypeError, match="bool"):
        parse_budgets({True: 1})
    with pytest.raises(ValueError, match=r"max_memory\['npu:0'\]"):
        parse_budgets({"npu:0": "lots"})
    with pytest.raises(ValueError, match="not a device"):
        parse_budgets({"NPU 0": 1})
    with pytest.raises(TypeError, match="mapping"):
        accelreg.plan_device_map(stack(), [("npu:0", 1)])


def test_backends_are_filled_in_first_appearance_order():
    model = stack()
    device_map = accelreg.plan_device_map(
        model, {"xpu:0": 1700, "npu:1": 1700, "npu:0": 1700}, strategy="sequential"
    )
    order = list(dict.fromkeys(device_map.values()))
    assert order[:2] == ["xpu:0", "npu:0"]


def test_without_max_memory_the_registry_gives_free_memory_less_the_reserve():
    accelreg.register(plugin(spec("cuda", 2)), "fakecuda")  # free: 1 GiB and 2 GiB
    result = plan(stack())
    budgets = result.budgets.as_dict()
    assert budgets["cuda:0"] == int((1 << 30) * (1 - RESERVE))
    assert budgets["cuda:1"] == int((2 << 30) * (1 - RESERVE))
    assert "cpu" in budgets and "disk" not in budgets
    assert result.budgets.source == "registry"
    assert set(result.device_map.values()) <= {"cuda:0", "cuda:1"}


def test_registry_devices_without_memory_information_are_an_error():
    from accelreg.types import BackendSpec

    accelreg.register(plugin(BackendSpec("cuda", 50, lambda: True, lambda: 1)), "fakecuda")
    with pytest.raises(accelreg.DeviceMapError, match="memory information"):
        plan(stack())


def test_only_cpu_here_plans_for_the_cpu():
    result = plan(stack())
    assert result.device_map == {"": "cpu"}


# -- strategies -------------------------------------------------------------------------------
def test_strategies_accept_transformers_words_and_reject_others():
    model = stack()
    budgets = {"npu:0": 2000, "npu:1": 2000, "npu:2": 2000}
    assert accelreg.plan_device_map(model, budgets, strategy="auto") == accelreg.plan_device_map(
        model, budgets
    )
    with pytest.raises(accelreg.DeviceMapError, match="balanced_low_0") as info:
        accelreg.plan_device_map(model, budgets, strategy="fastest")
    assert isinstance(info.value, ValueError)


def test_sequential_fills_in_order_balanced_spreads_low_0_spares_the_first():
    model = stack(n=6)
    budgets = {f"npu:{i}": 10_000 for i in range(3)}
    assert accelreg.plan_device_map(model, budgets, strategy="sequential") == {"": "npu:0"}
    loads = {u.place: u.used for u in plan(model, budgets).places}
    assert all(loads[p] > 0 for p in budgets)
    assert max(loads.values()) <= EMBED + 2 * BLOCK
    low = {u.place: u.used for u in plan(model, budgets, strategy="balanced_low_0").places}
    assert low["npu:0"] == 0 and low["npu:1"] > 0 and low["npu:2"] > 0


def test_balanced_low_0_with_device_ids_that_do_not_start_at_zero():
    model = stack(n=6)
    budgets = {"npu:1": 2000, "npu:2": 2000, "npu:3": 2000}
    low = {u.place: u.used for u in plan(model, budgets, strategy="balanced_low_0").places}
    assert low["npu:1"] < min(low["npu:2"], low["npu:3"])
    assert (
        violations(model, accelreg.plan_device_map(model, budgets, strategy="balanced_low_0"), budgets) == ()
    )


def test_forward_order_is_contiguous_with_one_extra_boundary_for_the_tied_head():
    model = stack(n=8)
    budgets = {f"npu:{i}": 1800 for i in range(4)}
    device_map = accelreg.plan_device_map(model, budgets)
    where = places(device_map, model)
    sequence = [where[n] for n, _ in model.named_parameters(remove_duplicate=False)]
    runs = [p for i, p in enumerate(sequence) if i == 0 or p != sequence[i - 1]]
    assert runs[:-1] == sorted(set(runs[:-1]), key=runs.index)  # visits each device once, in order
    assert runs[-1] == runs[0] == where["embed.weight"]  # the tied head returns to the first device


# -- dtype ------------------------------------------------------------------------------------
def test_dtype_scales_floating_tensors_only():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    full = plan(model, {"npu:0": 10**6}).total
    half = plan(model, {"npu:0": 10**6}, dtype="fp16").total
    counter = 8  # num_batches_tracked: one int64, never converted
    assert half - counter == (full - counter) // 2
    assert plan(model, {"npu:0": 10**6}, dtype=torch.bfloat16).total == half
    with pytest.raises(ValueError, match="accepted"):
        plan(model, {"npu:0": 1}, dtype="float13")
    with pytest.raises(ValueError, match="not a floating"):
        plan(model, {"npu:0": 1}, dtype=torch.int8)


def test_dtype_auto_reads_the_config():
    model = stack()
    model.config = type("Config", (), {"dtype": torch.float16})()
    assert plan(model, {"npu:0": 10**6}, dtype="auto").dtype == "float16"


# -- coverage ---------------------------------------------------------------------------------
class WithOwnTensors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(4))
        self.register_buffer("table", torch.empty(16))  # persistent
        self.register_buffer("cache", torch.empty(16), persistent=False)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)


def test_a_split_module_keeps_its_own_parameters_and_buffers_mapped():
    with torch.device("meta"):
        model = nn.Sequential(WithOwnTensors(), nn.Linear(8, 8))
    budgets = {"npu:0": 450, "npu:1": 450, "npu:2": 450}
    device_map = accelreg.plan_device_map(model, budgets, strategy="sequential")
    assert "0" not in device_map, "the module must be split for this test"
    assert {"0.scale", "0.table", "0.cache"} <= set(device_map)
    assert len({device_map["0.scale"], device_map["0.table"], device_map["0.cache"]}) == 1
    assert violations(model, device_map, budgets) == ()
    del device_map["0.table"]
    found = violations(model, device_map, budgets)
    assert any("covered by no key" in v and "0.table" in v for v in found)


def test_a_module_registered_twice_is_covered_under_both_names():
    with torch.device("meta"):
        shared = nn.Linear(8, 8)
        model = nn.ModuleDict(
            {"enc": nn.Sequential(shared, nn.Linear(8, 8)), "dec": nn.Sequential(nn.Linear(8, 8), shared)}
        )
    budgets = {"npu:0": 350, "npu:1": 350, "npu:2": 350}
    device_map = accelreg.plan_device_map(model, budgets)
    where = places(device_map, model)
    assert where["enc.0.weight"] == where["dec.1.weight"]
    assert violations(model, device_map, budgets) == ()


# -- ties -------------------------------------------------------------------------------------
def test_tied_weights_share_a_device_and_are_counted_once():
    model = stack()
    result = plan(model, {"npu:0": 1300, "npu:1": 1300, "npu:2": 1300, "npu:3": 1300})
    where = places(result.device_map, model)
    assert where["embed.weight"] == where["head.weight"]
    assert result.total == EMBED + 6 * BLOCK + NORM


def test_declared_ties_of_an_untied_model_are_honoured():
    model = stack(tie=False)
    model.all_tied_weights_keys = {"head.weight": "embed.weight"}  # as transformers' post_init records
    budgets = {f"npu:{i}": 1300 for i in range(4)}
    result = plan(model, budgets)
    where = places(result.device_map, model)
    assert where["head.weight"] == where["embed.weight"]
    assert result.total == EMBED + 6 * BLOCK + NORM  # tied at load time: one storage
    untied = plan(stack(tie=False), budgets)
    assert untied.total == result.total + EMBED


def test_caller_tied_parameters_are_honoured_and_checked():
    model = stack(tie=False)
    ties = [["blocks.0.fc1.weight", "blocks.5.fc2.weight"]]
    device_map = accelreg.plan_device_map(model, {f"npu:{i}": 1300 for i in range(4)}, tied_parameters=ties)
    where = places(device_map, model)
    assert where["blocks.0.fc1.weight"] == where["blocks.5.fc2.weight"]
    with pytest.raises(accelreg.DeviceMapError, match="does not have") as info:
        accelreg.plan_device_map(model, {"npu:0": 10**6}, tied_parameters=[["embed.weight", "nope.weight"]])
    assert any("nope.weight" in v for v in info.value.violations)
    with pytest.raises(TypeError):
        accelreg.plan_device_map(model, {"npu:0": 10**6}, tied_parameters=["embed.weight", "head.weight"])


# -- offload, headroom, errors ----------------------------------------------------------------
def test_offload_keeps_headroom_for_the_largest_offloaded_layer_on_the_main_device():
    model = stack(n=6)
    budgets = {"npu:0": EMBED + 2 * BLOCK + NORM, "npu:1": 2 * BLOCK, "cpu": 10**6}
    result = plan(model, budgets)
    usage = {u.place: u for u in result.places}
    assert usage["cpu"].used > 0
    assert usage["npu:0"].headroom == BLOCK
    assert usage["npu:0"].used + usage["npu:0"].headroom <= budgets["npu:0"]
    # the same map on a main device without that headroom is reported
    tight = dict(budgets, **{"npu:0": usage["npu:0"].used})
    found = violations(model, result.device_map, tight)
    assert any("headroom" in v and "npu:0" in v for v in found)


def test_a_unit_that_fits_nowhere_goes_to_cpu_while_later_layers_stay_on_devices():
    model = stack(n=6, tie=False)
    # blocks 1, 3 and 4 share a weight: one unit of three layers, bigger than any device, while
    # each of its layers fits (so the main device can run it when it is offloaded)
    model.blocks[3].fc1.weight = model.blocks[4].fc1.weight = model.blocks[1].fc1.weight
    unit = 3 * BLOCK - 2 * 4 * 64
    budgets = {"npu:0": 1200, "npu:1": 1200, "npu:2": 1200, "cpu": 10**6}
    assert unit > 1200
    result = plan(model, budgets)
    where = places(result.device_map, model)
    assert (
        where["blocks.1.fc1.weight"] == where["blocks.3.fc2.weight"] == where["blocks.4.fc1.weight"] == "cpu"
    )
    assert where["blocks.2.fc1.weight"].startswith("npu") and where["blocks.5.fc2.weight"].startswith("npu")
    assert where["head.weight"].startswith("npu")
    assert {u.place: u.headroom for u in result.places}["npu:0"] == BLOCK
    assert violations(model, result.device_map, budgets) == ()


def test_no_fit_says_by_how_much_and_where():
    with pytest.raises(accelreg.DeviceMapError) as info:
        accelreg.plan_device_map(stack(), {"npu:0": 1000, "cpu": 500})
    err = info.value
    assert "short by" in str(err)
    assert any("npu:0" in v and "cpu" in v for v in err.violations)
    # a no-split class covering the whole model: it cannot be split over two small devices
    with pytest.raises(accelreg.DeviceMapError, match=r"short by|fits on no place"):
        accelreg.plan_device_map(stack(), {"npu:0": 2000, "npu:1": 2000}, no_split_module_classes=["Stack"])


def test_a_layer_larger_than_every_device_cannot_be_offloaded_to_run_there():
    model = stack(vocab=256)  # embed 8 KB, bigger than any device
    budgets = {"npu:0": 4000, "npu:1": 4000, "cpu": 10**6}
    result = plan(model, budgets)
    assert result.device_map == {"": "cpu"}
    assert any("headroom" in note for note in result.notes)


def test_disk_is_only_used_with_a_budget_and_stages_through_the_cpu():
    model = stack()
    with pytest.raises(accelreg.DeviceMapError):
        accelreg.plan_device_map(model, {"cpu": 1000})
    device_map = accelreg.plan_device_map(model, {"cpu": 1500, "disk": "1MB"})
    assert "disk" in device_map.values()
    assert violations(model, device_map, {"cpu": 1500, "disk": "1MB"}) == ()


# -- check_device_map -------------------------------------------------------------------------
def test_check_names_every_violation():
    model = stack(n=2)
    bad = {
        "embed": "npu:0",
        "blocks.0.fc1": "npu:0",
        "blocks.0.fc2": "npu:1",  # splits a no-split block
        "blocks.1": "npu:1",
        "blocks.1.fc1": "npu:1",  # covered twice
        "norm.weight": "npu:0",
        "norm.bias": "npu:1",  # splits a leaf module
        "head": "cpu",  # tied to embed on npu:0
        "ghost": "npu:0",  # no such module
        "blocks": "meta",  # not a place
    }
    with pytest.raises(accelreg.DeviceMapError) as info:
        accelreg.check_device_map(model, bad, {"npu:0": 10**6, "cpu": 10**6})
    found = "\n".join(info.value.violations)
    for needle in (
        "no-split module 'blocks.0' (Block) is split",
        "'blocks.1.fc1.weight' is covered by 2 keys",
        "module 'norm' (LayerNorm) is split",
        "tied group [embed.weight, head.weight] is split",
        "key 'ghost' names no module",
        "value of 'blocks'",
        "npu:1 holds",  # npu:1 has no budget
    ):
        assert needle in found, needle


def test_check_accepts_torch_devices_and_reports_budget_overflow():
    model = stack(n=2)
    good = {"": torch.device("xpu", 0)}
    accelreg.check_device_map(model, good, {"xpu:0": 10**6})
    accelreg.check_device_map(model, good)  # no budgets: structure only
    with pytest.raises(accelreg.DeviceMapError, match="exceeds its") as info:
        accelreg.check_device_map(model, {"": torch.device("cpu")}, {"cpu": 100})
    assert "by" in info.value.violations[0]


def test_check_rejects_non_mappings():
    with pytest.raises(accelreg.DeviceMapError, match="mapping"):
        accelreg.check_device_map(stack(), ["npu:0"])


def test_plans_are_json_ready():
    import json

    result = plan(stack(), {"npu:0": 1300, "npu:1": 1300, "npu:2": 1300, "npu:3": 1300})
    data = json.loads(json.dumps(result.as_dict()))
    assert data["device_map"] == result.device_map
    assert sum(p["used"] for p in data["places"]) == result.total


def test_default_budgets_are_the_current_backend_only():
    """A node with two runtimes never gets a map mixing them: budgets follow resolve()."""
    from accelreg.planner import default_max_memory

    accelreg.register(plugin(spec("cuda", 2, priority=100), spec("xpu", 3, priority=90)), "fake_two_runtimes")
    assert [k for k in default_max_memory()] == ["cuda:0", "cuda:1", "cpu"]
    accelreg.configure(priority=["xpu"])
    assert [k for k in default_max_memory()] == ["xpu:0", "xpu:1", "xpu:2", "cpu"]
