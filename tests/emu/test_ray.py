"""Ray on the emulated accelerator: the registry's backends are Ray resources (issue 19, items
3-5). Ray Core shows and isolates the devices of npu (a name Ray has, detected by Ray from
``/dev/davinci*`` only), mlu (a name Ray lacks) and emu (a vendor backend Ray has never heard
of); Ray Train trains on them over the registry's collectives; two Ray nodes on localhost, each
started with ``accelreg run -- ray start``, form one cluster; and Ray's own detection is
unchanged where accelreg adds nothing.

Each cluster is one driver process (all its checks in one run, :func:`._ray.ray_checks`), or
nodes stopped by their own handles (:class:`._ray.RayNode`). Ray is kept to 2 CPUs, 80 MiB of
object store, no dashboard.
"""

from __future__ import annotations

import pytest

from ._ray import RayNode, free_port, ray_checks
from ._runner import check_names

pytest.importorskip("ray", reason="Ray is in the [ray] extra (the [test] extra installs it)")

pytestmark = [pytest.mark.emu, pytest.mark.slow]

#: The driver's start: its own local Ray (2 CPUs), stopped and cleaned at exit.
LOCAL = r"""
import atexit, json, os, shutil, tempfile
import ray

_tmp = tempfile.mkdtemp(prefix="ar-", dir="/tmp")
ray.init(num_cpus=2, object_store_memory=80 << 20, _temp_dir=_tmp, include_dashboard=False,
         _node_ip_address="127.0.0.1", log_to_driver=False)
atexit.register(lambda: (ray.shutdown(), shutil.rmtree(_tmp, ignore_errors=True)))
"""

#: What a task sees (MASK: the backend's visible-devices variable, defined by each script).
WHERE = r"""
@ray.remote(num_cpus=0)
def where():
    import accelreg
    return {
        "pid": os.getpid(),
        "node": ray.get_runtime_context().get_node_id(),
        "mask": os.environ.get(MASK),
        "id": os.environ.get("ACCELREG_DEVICE_ID"),
        "count": accelreg.device_count(),
        "device": str(accelreg.resolve()),
        "auto_install": os.environ.get("ACCELREG_AUTO_INSTALL"),
        "run": os.environ.get("ACCELREG_RUN"),
    }
"""

#: A 3-step Ray Train run over 2 workers with one unit each; every worker writes what it saw.
TRAIN = r"""
def _train(resource, mask, placement="PACK"):
    import tempfile
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = tempfile.mkdtemp(prefix="accelreg-train-")

    def loop(config):
        import json, os
        import torch, torch.distributed as dist
        import accelreg, ray.train, ray.train.torch
        device = ray.train.torch.get_device()
        torch.manual_seed(0)
        model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rank = ray.train.get_context().get_world_rank()
        g = torch.Generator().manual_seed(rank)  # different data per rank: DDP must average
        for _ in range(3):
            x = torch.randn(8, 4, generator=g).to(device)
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        seen = {
            "device": str(device), "resolve": str(accelreg.resolve()), "count": accelreg.device_count(),
            "process_group": dist.get_backend(), "dist_backend": accelreg.dist_backend(),
            "param_device": str(next(model.parameters()).device), "local_rank": os.environ.get("LOCAL_RANK"),
            "node": ray.get_runtime_context().get_node_id(),
            "mask": os.environ.get(config["mask"]), "id": os.environ.get("ACCELREG_DEVICE_ID"),
            "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        }
        with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as fh:
            json.dump(seen, fh)

    TorchTrainer(
        loop,
        train_loop_config={"out": out, "mask": mask},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={resource: 1}, placement_strategy=placement),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="accelreg-train-store-"), name="t"),
    ).fit()
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]


def _check_trained(ranks, backend):
    for seen in ranks:
        assert seen["device"] == seen["resolve"] == seen["param_device"], seen
        # the worker's own device: its id's place in its mask (Ray Train 2 keeps one id per
        # worker: always :0; Train 1 on Ray 2.50 shares the node's ids among its workers)
        visible = seen["mask"].split(",")
        owner, _, physical = seen["id"].partition("=")
        assert owner == backend and seen["device"] == f"{backend}:{visible.index(physical)}", seen
        assert seen["count"] == len(visible), seen
        assert seen["process_group"] == seen["dist_backend"], seen  # the registry's collectives
    if ranks[0]["node"] == ranks[1]["node"]:
        assert ranks[0]["id"] != ranks[1]["id"], ranks  # two devices, one per worker
    assert ranks[0]["params"] == ranks[1]["params"]  # DDP averaged the gradients across workers
"""

# -- npu: accelreg.install(); ray.init() in the driver (no accelreg run) ------------------------
NPU = (
    "import accelreg\naccelreg.install()\nMASK = 'ASCEND_RT_VISIBLE_DEVICES'\n"
    + LOCAL
    + WHERE
    + TRAIN
    + r"""

def check_the_node_offers_its_npus_as_rays_npu_resource():
    assert ray.cluster_resources().get("NPU") == 2.0, ray.cluster_resources()


def check_each_task_sees_only_its_own_device():
    seen = ray.get([where.options(resources={"NPU": 1}).remote() for _ in range(6)])
    for s in seen:
        assert s["count"] == 1 and s["device"] == "npu:0", s
        assert s["mask"] in ("0", "1") and s["id"] == f"npu={s['mask']}", s
    # both devices are handed out, and a reused worker re-reads its new mask
    assert {s["mask"] for s in seen} <= {"0", "1"}


def check_a_task_given_two_units_sees_two_devices():
    s = ray.get(where.options(resources={"NPU": 2}).remote())
    assert s["count"] == 2 and s["device"] == "npu:0" and sorted(s["mask"].split(",")) == ["0", "1"], s


def check_a_task_without_units_sees_the_node_as_it_is():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray <= 2.55 hides every device from it (below)
        s = ray.get(where.remote())
    assert s["id"] is None, s
    # Ray 2.56 and later leave the variable alone for a task given no units; earlier releases
    # set it to "" (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO on by default): no device at all
    assert (s["mask"], s["count"], s["device"]) in ((None, 2, "npu:0"), ("", 1, "cpu")), s


def check_a_task_start_never_rebuilds_the_registry():
    # The per-task path (Ray's set and reset of a task's masks, with accelreg's seams) drops the
    # registry's snapshot but never builds one (a build loads the plugins: tens of ms a task).

    @ray.remote(num_cpus=0, resources={"NPU": 1})
    def starts():
        from ray._private import utils
        from accelreg.registry import snapshot

        built, init = [], snapshot.Snapshot.__init__

        def counting(self, *args, **kwargs):
            built.append(1)
            init(self, *args, **kwargs)

        snapshot.Snapshot.__init__ = counting
        try:
            for _ in range(20):
                utils.reset_visible_accelerator_env_vars(utils.set_visible_accelerator_ids())
        finally:
            snapshot.Snapshot.__init__ = init
        return len(built), os.environ.get("ACCELREG_DEVICE_ID")

    built, assigned = ray.get(starts.remote())
    assert built == 0 and assigned and assigned.startswith("npu="), (built, assigned)


def check_two_actors_hold_the_two_devices():
    @ray.remote(num_cpus=0, resources={"NPU": 1})
    class Holder:
        def report(self):
            import accelreg
            return os.environ.get(MASK), accelreg.device_count(), str(accelreg.resolve())

    holders = [Holder.remote(), Holder.remote()]
    reports = ray.get([h.report.remote() for h in holders])
    assert sorted(r[0] for r in reports) == ["0", "1"], reports
    assert all(r[1:] == (1, "npu:0") for r in reports), reports
    for h in holders:
        ray.kill(h)


def check_workers_install_accelreg_through_the_raylet():
    s = ray.get(where.options(resources={"NPU": 1}).remote())
    assert s["auto_install"] == "1" and s["run"] is None, s


def check_ray_train_trains_on_the_npus_over_hccl():
    ranks = _train("NPU", MASK)
    _check_trained(ranks, "npu")
    assert ranks[0]["process_group"] == "hccl"  # Ray alone picks gloo for NPU workers
"""
)


@pytest.fixture(scope="module")
def npu_results() -> dict[str, str]:
    return ray_checks(NPU, "npu", devices=2)


@pytest.mark.parametrize("check", check_names(NPU))
def test_ray_on_emulated_npu(npu_results: dict[str, str], check: str) -> None:
    assert npu_results[check] == "ok", npu_results[check]


# -- mlu: a name Ray does not have, the driver under `accelreg run --devices 1,0` ---------------
MLU = (
    "MASK = 'MLU_VISIBLE_DEVICES'\n"
    + LOCAL
    + WHERE
    + TRAIN
    + r"""

def check_the_driver_is_armed_by_accelreg_run():
    import accelreg.integrations as integrations
    status = {i["name"]: i["enabled"] for i in integrations.status()}
    assert status["ray"] is True, status


def check_the_node_offers_its_mlus_as_mlu():
    assert ray.cluster_resources().get("MLU") == 2.0, ray.cluster_resources()


def check_tasks_get_the_physical_ids_of_the_jobs_mask():
    seen = ray.get([where.options(resources={"MLU": 1}).remote() for _ in range(4)])
    for s in seen:
        assert s["count"] == 1 and s["device"] == "mlu:0" and s["mask"] in ("0", "1"), s
        assert s["id"] == f"mlu={s['mask']}" and s["run"] == "1", s


def check_concurrent_actors_get_distinct_devices_of_the_jobs_mask():
    @ray.remote(num_cpus=0, resources={"MLU": 1})
    class Holder:
        def where(self):
            w = ray._private.worker.global_worker
            return {"mask": os.environ.get(MASK), "slots": [i for i, _ in w.core_worker.resource_ids()["MLU"]]}

    holders = [Holder.remote() for _ in range(2)]
    seen = ray.get([h.where.remote() for h in holders])
    for h in holders:
        ray.kill(h)
    # Ray gives a resource outside its unit-instance list id 0 for every task: both on one device
    assert sorted(s["mask"] for s in seen) == ["0", "1"], seen
    for s in seen:  # unit i is entry i of the job's mask (accelreg run --devices 1,0)
        assert s["mask"] == ["1", "0"][s["slots"][0]], seen


def check_train_would_use_cncl():
    from accelreg.integrations import ray_train
    import ray.train.torch  # noqa: F401 - enables the ray_train integration
    assert ray_train.collective_backend({"MLU": 1}) == ("mlu", "cncl")


def check_ray_train_trains_on_the_mlus_over_cncl():
    ranks = _train("MLU", MASK)
    _check_trained(ranks, "mlu")
    assert ranks[0]["process_group"] == "cncl"  # Ray has no MLU: alone it trains on the cpu over gloo
"""
)


@pytest.fixture(scope="module")
def mlu_results() -> dict[str, str]:
    return ray_checks(MLU, "mlu", devices=2, under_run=["--devices", "1,0"])


@pytest.mark.parametrize("check", check_names(MLU))
def test_ray_on_emulated_mlu_under_accelreg_run(mlu_results: dict[str, str], check: str) -> None:
    assert mlu_results[check] == "ok", mlu_results[check]


# -- node resources as Ray computes them at node start (no cluster) -----------------------------
NODE = r"""
import warnings
import accelreg
from accelreg.integrations import ray as ray_integration


def _node_resources():
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec

    spec = ResourceAndLabelSpec(num_cpus=1, memory=1 << 30, object_store_memory=80 << 20)
    spec.resolve(is_head=True, node_ip_address="127.0.0.1")
    return spec.to_resource_dict()
"""

NODE_NONE = (
    NODE
    + r"""

def check_stock_and_accelreg_nodes_agree_where_accelreg_adds_nothing():
    import ray  # noqa: F401
    ray_integration.disable()
    stock = _node_resources()
    ray_integration.enable()
    ours = _node_resources()
    assert ours == stock, (stock, ours)
"""
)

NODE_EMU = (
    NODE
    + r"""

def check_a_vendor_backend_is_offered_under_its_own_name():
    import ray  # noqa: F401
    ray_integration.disable()
    assert "EMU" not in _node_resources()
    ray_integration.enable()
    assert _node_resources()["EMU"] == 2
"""
)

NODE_FAILING = (
    NODE.replace("def check_stock_and", "def _unused")
    + r"""

def check_a_failing_backend_warns_at_node_start_and_gives_no_unit():
    import ray  # noqa: F401
    ray_integration.enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resources = _node_resources()
    assert "NPU" not in resources, resources
    text = " | ".join(str(w.message) for w in caught)
    assert "npu is present on this Ray node" in text and "ACCELREG_EMU_DEVICES" in text, text
    assert "Ray gets 0 NPU units" in text, text
"""
)


@pytest.mark.parametrize(
    ("name", "devices", "script"),
    [(None, 2, NODE_NONE), ("emu", 2, NODE_EMU), ("npu", 100, NODE_FAILING)],
    ids=["no-accelerator", "vendor-emu", "failing-npu"],
)
def test_node_resources_at_node_start(name: str | None, devices: int, script: str) -> None:
    results = ray_checks(script, name, devices=devices, timeout=300)
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())


# -- two nodes on localhost, a vendor backend ---------------------------------------------------
CLUSTER = (
    r"""
import json, os
import ray

ray.init(address=os.environ["RAY_TEST_ADDRESS"], _node_ip_address="127.0.0.1", log_to_driver=False)
MASK = "ACCELREG_EMU_VISIBLE_DEVICES"
"""
    + WHERE
    + TRAIN
    + r"""

def check_the_driver_sees_the_sum_of_both_nodes():
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2, alive
    assert ray.cluster_resources().get("EMU") == 3.0, ray.cluster_resources()
    assert sorted(n["Resources"].get("EMU") for n in alive) == [1.0, 2.0], alive


def check_tasks_run_on_both_nodes_on_their_own_devices():
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
    nodes = {n["NodeID"]: n["Resources"]["EMU"] for n in ray.nodes() if n["Alive"]}
    for node, units in nodes.items():
        seen = ray.get([where.options(resources={"EMU": 1}, scheduling_strategy=On(node, soft=False)).remote()
                        for _ in range(2)])
        for s in seen:
            assert s["node"] == node and s["count"] == 1 and s["device"] == "emu:0", s
            assert int(s["mask"]) < units and s["run"] == "1", s


def check_ray_train_spans_both_nodes_over_the_vendors_collectives():
    ranks = _train("EMU", MASK, placement="STRICT_SPREAD")
    _check_trained(ranks, "emu")
    assert ranks[0]["process_group"] == "emuccl" and ranks[0]["node"] != ranks[1]["node"], ranks
"""
)


def test_two_ray_nodes_on_localhost() -> None:
    port = free_port()
    with RayNode(name="emu", devices=2, head=True, port=port) as head:
        head.wait_started()
        with RayNode(name="emu", devices=1, head=False, address=f"127.0.0.1:{port}") as worker:
            worker.wait_started()
            results = ray_checks(
                CLUSTER, "emu", devices=2, under_run=[], extra_env={"RAY_TEST_ADDRESS": f"127.0.0.1:{port}"}
            )
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())
