"""Ray on the emulated accelerator: the registry's backends are Ray resources (issue 19, items
3-5). Ray Core shows and isolates the devices of npu (a name Ray has, detected by Ray from
``/dev/davinci*`` only), mlu (a name Ray lacks) and emu (a vendor backend Ray has never heard
of); Ray Train trains on them over the registry's collectives; two Ray nodes on localhost, each
started with ``accelreg run -- ray start``, form one cluster; and Ray's own detection is
unchanged where accelreg adds nothing.

Each cluster's tests run in one child process of the ``accelreg_emu`` marker, the cluster's
driver: a module-scoped fixture starts the driver's own local Ray (:func:`._ray.local_ray`) or
joins nodes it started itself (:class:`._ray.RayNode`), and stops them by their own handles
after the last test. Ray is kept to 2 CPUs, 80 MiB of object store, no dashboard.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import accelreg
from accelreg.launch.masks import visible_devices_env
from accelreg.launch.startup import ENV_RUN

from ._ray import RAY_ENV, RayNode, free_port, local_ray

ray = pytest.importorskip("ray", reason="Ray is in the [ray] extra (the [test] extra installs it)")

pytestmark = [pytest.mark.emu, pytest.mark.slow]


@ray.remote(num_cpus=0)
def where(mask: str) -> dict[str, Any]:
    """What a task sees (``mask``: the backend's visible-devices variable)."""
    import accelreg

    return {
        "pid": os.getpid(),
        "node": ray.get_runtime_context().get_node_id(),
        "mask": os.environ.get(mask),
        "id": os.environ.get("ACCELREG_DEVICE_ID"),
        "count": accelreg.device_count(),
        "device": str(accelreg.resolve()),
        "auto_install": os.environ.get("ACCELREG_AUTO_INSTALL"),
        "run": os.environ.get("ACCELREG_RUN"),
    }


def train(resource: str, mask: str, placement: str = "PACK") -> list[dict[str, Any]]:
    """A 3-step Ray Train run over 2 workers with one unit each; what every worker saw."""
    with tempfile.TemporaryDirectory(prefix="accelreg-train-") as folder:
        return _train(resource, mask, placement, folder)


def _train(resource: str, mask: str, placement: str, folder: str) -> list[dict[str, Any]]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = os.path.join(folder, "ranks")
    os.mkdir(out)

    def loop(config: dict[str, str]) -> None:
        import json
        import os

        import ray.train
        import ray.train.torch
        import torch
        import torch.distributed as dist

        import accelreg

        device = ray.train.torch.get_device()
        torch.manual_seed(0)
        model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rank = ray.train.get_context().get_world_rank()
        g = torch.Generator().manual_seed(rank)  # different data per rank: DDP must average
        for _ in range(3):
            x = torch.randn(8, 4, generator=g).to(device)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        seen = {
            "device": str(device),
            "resolve": str(accelreg.resolve()),
            "count": accelreg.device_count(),
            "process_group": dist.get_backend(),
            "dist_backend": accelreg.dist_backend(),
            "param_device": str(next(model.parameters()).device),
            "local_rank": os.environ.get("LOCAL_RANK"),
            "node": ray.get_runtime_context().get_node_id(),
            "mask": os.environ.get(config["mask"]),
            "id": os.environ.get("ACCELREG_DEVICE_ID"),
            "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        }
        with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as fh:
            json.dump(seen, fh)

    TorchTrainer(
        loop,
        train_loop_config={"out": out, "mask": mask},
        scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={resource: 1}, placement_strategy=placement
        ),
        run_config=RunConfig(storage_path=os.path.join(folder, "store"), name="t"),
    ).fit()
    ranks = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as fh:
            ranks.append(json.load(fh))
    return ranks


def assert_trained(ranks: list[dict[str, Any]], backend: str) -> None:
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


# -- npu: accelreg.install(); ray.init() in the driver (no accelreg run) ------------------------
NPU_MASK = "ASCEND_RT_VISIBLE_DEVICES"


@pytest.fixture(scope="module")
def npu_ray() -> Iterator[None]:
    """The driver: accelreg.install(), then its own local Ray."""
    accelreg.install()
    with local_ray():
        yield


@pytest.mark.accelreg_emu(name="npu", devices=2, **RAY_ENV)
class TestRayOnEmulatedNpu:
    def test_the_node_offers_its_npus_as_rays_npu_resource(self, npu_ray: None) -> None:
        assert ray.cluster_resources().get("NPU") == 2.0, ray.cluster_resources()

    def test_each_task_sees_only_its_own_device(self, npu_ray: None) -> None:
        seen = ray.get([where.options(resources={"NPU": 1}).remote(NPU_MASK) for _ in range(6)])
        for s in seen:
            assert s["count"] == 1 and s["device"] == "npu:0", s
            assert s["mask"] in ("0", "1") and s["id"] == f"npu={s['mask']}", s
        # both devices are handed out, and a reused worker re-reads its new mask
        assert {s["mask"] for s in seen} <= {"0", "1"}

    def test_a_task_given_two_units_sees_two_devices(self, npu_ray: None) -> None:
        s = ray.get(where.options(resources={"NPU": 2}).remote(NPU_MASK))
        assert s["count"] == 2 and s["device"] == "npu:0" and sorted(s["mask"].split(",")) == ["0", "1"], s

    def test_a_task_without_units_sees_the_node_as_it_is(self, npu_ray: None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Ray <= 2.55 hides every device from it (below)
            s = ray.get(where.remote(NPU_MASK))
        assert s["id"] is None, s
        # Ray 2.56 and later leave the variable alone for a task given no units; earlier releases
        # set it to "" (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO on by default): no device at all
        assert (s["mask"], s["count"], s["device"]) in ((None, 2, "npu:0"), ("", 1, "cpu")), s

    def test_a_task_start_never_rebuilds_the_registry(self, npu_ray: None) -> None:
        # The per-task path (Ray's set and reset of a task's masks, with accelreg's seams) drops
        # the registry's snapshot but never builds one (a build loads the plugins: tens of ms a task).

        @ray.remote(num_cpus=0, resources={"NPU": 1})
        def starts() -> tuple[int, str | None]:
            from ray._private import utils

            from accelreg.registry import snapshot

            built, init = [], snapshot.Snapshot.__init__

            def counting(self: Any, *args: Any, **kwargs: Any) -> None:
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

    def test_two_actors_hold_the_two_devices(self, npu_ray: None) -> None:
        @ray.remote(num_cpus=0, resources={"NPU": 1})
        class Holder:
            def report(self) -> tuple[str | None, int, str]:
                import accelreg

                return os.environ.get(NPU_MASK), accelreg.device_count(), str(accelreg.resolve())

        holders = [Holder.remote(), Holder.remote()]
        reports = ray.get([h.report.remote() for h in holders])
        assert sorted(r[0] for r in reports) == ["0", "1"], reports
        assert all(r[1:] == (1, "npu:0") for r in reports), reports
        for h in holders:
            ray.kill(h)

    def test_workers_install_accelreg_through_the_raylet(self, npu_ray: None) -> None:
        s = ray.get(where.options(resources={"NPU": 1}).remote(NPU_MASK))
        assert s["auto_install"] == "1" and s["run"] is None, s

    def test_ray_train_trains_on_the_npus_over_hccl(self, npu_ray: None) -> None:
        ranks = train("NPU", NPU_MASK)
        assert_trained(ranks, "npu")
        assert ranks[0]["process_group"] == "hccl"  # Ray alone picks gloo for NPU workers


# -- npu disabled in accelreg (issue 28): no task puts work on it ------------------------------
@ray.remote(num_cpus=0)
def disabled_npu_view() -> dict[str, Any]:
    """What a task on a node whose npu the user disabled in accelreg would use: torch_npu is
    imported, as a library brings its runtime up; torch's own answer against the one every
    library gets."""
    import importlib

    import torch

    import accelreg
    from accelreg.integrations._machinery.seams import original

    importlib.import_module("torch_npu")
    return {
        "torch_own": str(original(torch.accelerator.current_accelerator)()),
        "accelerator": str(torch.accelerator.current_accelerator()),
        "count": torch.accelerator.device_count(),
        "device": str(accelreg.resolve()),
        "mask": os.environ.get(NPU_MASK),
    }


@pytest.fixture(scope="module")
def disabled_ray() -> Iterator[None]:
    """The driver: accelreg.install(), then its own local Ray (the raylet's workers get accelreg)."""
    accelreg.install()
    with local_ray():
        yield


@pytest.mark.accelreg_emu(name="npu", devices=2, ACCELREG_DISABLE="npu", **RAY_ENV)
class TestRayWithNpuDisabledInAccelreg:
    def test_the_node_offers_no_npu(self, disabled_ray: None) -> None:
        assert "NPU" not in ray.cluster_resources(), ray.cluster_resources()

    def test_a_task_never_puts_work_on_the_disabled_backend(self, disabled_ray: None) -> None:
        seen = ray.get(disabled_npu_view.remote())
        assert seen["torch_own"] == "npu", seen  # the runtime is up: torch alone would answer npu
        assert (seen["accelerator"], seen["count"], seen["device"]) == ("None", 0, "cpu"), seen
        # no unit of npu given: Ray 2.56+ leaves the mask alone, earlier releases hide every device
        assert seen["mask"] in (None, ""), seen


# -- mlu: a name Ray does not have, the driver under `accelreg run --devices 1,0` ---------------
MLU_MASK = "MLU_VISIBLE_DEVICES"
#: The environment `accelreg run --devices 1,0 -- CMD` gives CMD on the emulated mlu: the job's
#: mark and the mask (the driver fixture checks it against what accelreg run computes).
UNDER_ACCELREG_RUN = {ENV_RUN: "1", MLU_MASK: "1,0"}


@pytest.fixture(scope="module")
def mlu_ray() -> Iterator[None]:
    """The driver, armed at start-up as under accelreg run (no install() here), with its own
    local Ray."""
    assert visible_devices_env("mlu", [1, 0]) == {MLU_MASK: "1,0"}  # accelreg run's own mask
    assert {k: os.environ.get(k) for k in UNDER_ACCELREG_RUN} == UNDER_ACCELREG_RUN
    with local_ray():
        yield


@pytest.mark.accelreg_emu(name="mlu", devices=2, **RAY_ENV, **UNDER_ACCELREG_RUN)
class TestRayOnEmulatedMluUnderAccelregRun:
    def test_the_driver_is_armed_by_accelreg_run(self, mlu_ray: None) -> None:
        import accelreg.integrations as integrations

        status = {i["name"]: i["enabled"] for i in integrations.status()}
        assert status["ray"] is True, status

    def test_the_node_offers_its_mlus_as_mlu(self, mlu_ray: None) -> None:
        assert ray.cluster_resources().get("MLU") == 2.0, ray.cluster_resources()

    def test_tasks_get_the_physical_ids_of_the_jobs_mask(self, mlu_ray: None) -> None:
        seen = ray.get([where.options(resources={"MLU": 1}).remote(MLU_MASK) for _ in range(4)])
        for s in seen:
            assert s["count"] == 1 and s["device"] == "mlu:0" and s["mask"] in ("0", "1"), s
            assert s["id"] == f"mlu={s['mask']}" and s["run"] == "1", s

    def test_concurrent_actors_get_distinct_devices_of_the_jobs_mask(self, mlu_ray: None) -> None:
        @ray.remote(num_cpus=0, resources={"MLU": 1})
        class Holder:
            def where(self) -> dict[str, Any]:
                w = ray._private.worker.global_worker
                return {
                    "mask": os.environ.get(MLU_MASK),
                    "slots": [i for i, _ in w.core_worker.resource_ids()["MLU"]],
                }

        holders = [Holder.remote() for _ in range(2)]
        seen = ray.get([h.where.remote() for h in holders])
        for h in holders:
            ray.kill(h)
        # Ray gives a resource outside its unit-instance list id 0 for every task: both on one device
        assert sorted(s["mask"] for s in seen) == ["0", "1"], seen
        for s in seen:  # unit i is entry i of the job's mask (accelreg run --devices 1,0)
            assert s["mask"] == ["1", "0"][s["slots"][0]], seen

    def test_train_would_use_cncl(self, mlu_ray: None) -> None:
        import ray.train.torch  # noqa: F401 - enables the ray_train integration

        from accelreg.integrations.ray import train as ray_train

        assert ray_train.collective_backend({"MLU": 1}) == ("mlu", "cncl")

    def test_ray_train_trains_on_the_mlus_over_cncl(self, mlu_ray: None) -> None:
        ranks = train("MLU", MLU_MASK)
        assert_trained(ranks, "mlu")
        assert ranks[0]["process_group"] == "cncl"  # Ray has no MLU: alone it trains on the cpu over gloo


# -- node resources as Ray computes them at node start (no cluster) -----------------------------
def node_resources() -> dict[str, float]:
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec

    spec = ResourceAndLabelSpec(num_cpus=1, memory=1 << 30, object_store_memory=80 << 20)
    spec.resolve(is_head=True, node_ip_address="127.0.0.1")
    return spec.to_resource_dict()


@pytest.mark.accelreg_emu(name=None, **RAY_ENV)
def test_node_resources_stock_and_accelreg_agree_where_accelreg_adds_nothing() -> None:
    from accelreg.integrations import ray as ray_integration

    ray_integration.disable()
    stock = node_resources()
    ray_integration.enable()
    ours = node_resources()
    assert ours == stock, (stock, ours)


@pytest.mark.accelreg_emu(name="emu", devices=2, **RAY_ENV)
def test_node_resources_offer_a_vendor_backend_under_its_own_name() -> None:
    from accelreg.integrations import ray as ray_integration

    ray_integration.disable()
    assert "EMU" not in node_resources()
    ray_integration.enable()
    assert node_resources()["EMU"] == 2


@pytest.mark.accelreg_emu(name="npu", devices=100, **RAY_ENV)
def test_node_resources_a_failing_backend_warns_at_node_start_and_gives_no_unit() -> None:
    from accelreg.integrations import ray as ray_integration

    ray_integration.enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resources = node_resources()
    assert "NPU" not in resources, resources
    text = " | ".join(str(w.message) for w in caught)
    assert "npu is present on this Ray node" in text and "ACCELREG_EMU_DEVICES" in text, text
    assert "Ray gets 0 NPU units" in text, text


# -- two nodes on localhost, a vendor backend ---------------------------------------------------
EMU_MASK = "ACCELREG_EMU_VISIBLE_DEVICES"
#: The driver: `accelreg run -- python ...` (no --devices) on the emulated emu.
TWO_RAY_NODES = pytest.mark.accelreg_emu(name="emu", devices=2, **RAY_ENV, **{ENV_RUN: "1"})


@pytest.fixture(scope="module")
def two_ray_nodes() -> Iterator[None]:
    """A head node with 2 emu devices and a worker node with 1 (each `accelreg run -- ray start
    --block`, its own handle), and this driver connected to them."""
    port = free_port()
    with RayNode(name="emu", devices=2, head=True, port=port) as head:
        head.wait_started()
        with RayNode(name="emu", devices=1, head=False, address=f"127.0.0.1:{port}") as worker:
            worker.wait_started()
            ray.init(address=f"127.0.0.1:{port}", _node_ip_address="127.0.0.1", log_to_driver=False)
            try:
                yield
            finally:
                ray.shutdown()


@TWO_RAY_NODES
def test_two_ray_nodes_the_driver_sees_the_sum_of_both_nodes(two_ray_nodes: None) -> None:
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2, alive
    assert ray.cluster_resources().get("EMU") == 3.0, ray.cluster_resources()
    assert sorted(n["Resources"].get("EMU") for n in alive) == [1.0, 2.0], alive


@TWO_RAY_NODES
def test_two_ray_nodes_tasks_run_on_both_nodes_on_their_own_devices(two_ray_nodes: None) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

    nodes = {n["NodeID"]: n["Resources"]["EMU"] for n in ray.nodes() if n["Alive"]}
    for node, units in nodes.items():
        on_node = where.options(resources={"EMU": 1}, scheduling_strategy=On(node, soft=False))
        seen = ray.get([on_node.remote(EMU_MASK) for _ in range(2)])
        for s in seen:
            assert s["node"] == node and s["count"] == 1 and s["device"] == "emu:0", s
            assert int(s["mask"]) < units and s["run"] == "1", s


@TWO_RAY_NODES
def test_two_ray_nodes_ray_train_spans_both_nodes_over_the_vendors_collectives(two_ray_nodes: None) -> None:
    ranks = train("EMU", EMU_MASK, placement="STRICT_SPREAD")
    assert_trained(ranks, "emu")
    assert ranks[0]["process_group"] == "emuccl" and ranks[0]["node"] != ranks[1]["node"], ranks
