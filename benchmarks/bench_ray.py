"""Ray with accelreg vs stock Ray, on one node, for a backend Ray already knows (NPU).

    python benchmarks/bench_ray.py                  # 5 paired rounds, prints a Markdown table
    python benchmarks/bench_ray.py --rounds 7 --tasks 1000

Every arm is a fresh driver process on the emulated npu (``ACCELREG_EMU_NAME=npu``, 2 devices)
that imports torch (as an ML driver does), starts its own local Ray (2 CPUs, 80 MiB object store,
no dashboard), starts its workers with a warm-up of 20 tasks, then times ``--tasks`` tiny tasks
that each request one ``NPU`` unit (``ray.get`` of all of them; the task returns 0):

- **stock**: Ray alone, the two NPUs declared by hand (``ray.init(resources={"NPU": 2})``): Ray's
  own NPU manager assigns them and sets ``ASCEND_RT_VISIBLE_DEVICES`` per task — Ray's own path
  for an accelerator it knows. (Ray's own detection cannot find the emulated devices: it counts
  ``/dev/davinci*``; declaring them is what a user without accelreg does.)
- **accelreg**: ``accelreg.install(); ray.init()``: the registry counts the devices; each task's
  mask, ``ACCELREG_DEVICE_ID`` and a registry refresh come from accelreg's manager and seams, and
  every worker installs accelreg at start-up (``ACCELREG_AUTO_INSTALL`` from the raylet).

Rounds alternate the order of the arms. Reported: medians over rounds of ``ray.init()`` seconds
and tasks per second, and the median of the per-round ratios accelreg / stock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ARM = r"""
import json, os, shutil, sys, tempfile, time
import torch  # an ML driver has it imported before ray.init()

ARM, TASKS = sys.argv[1], int(sys.argv[2])
if ARM == "accelreg":
    import accelreg
    accelreg.install()
import ray

tmp = tempfile.mkdtemp(prefix="arb-", dir="/tmp")
kwargs = dict(num_cpus=2, object_store_memory=80 << 20, _temp_dir=tmp, include_dashboard=False,
              _node_ip_address="127.0.0.1", log_to_driver=False)
if ARM == "stock":
    kwargs["resources"] = {"NPU": 2}
t0 = time.perf_counter()
ray.init(**kwargs)
init_s = time.perf_counter() - t0
assert ray.cluster_resources().get("NPU") == 2.0, ray.cluster_resources()


@ray.remote(num_cpus=0, resources={"NPU": 1})
def tiny():
    return 0


@ray.remote(num_cpus=0, resources={"NPU": 1})
def mask():
    return os.environ.get("ASCEND_RT_VISIBLE_DEVICES")


assert set(ray.get([mask.remote() for _ in range(20)])) <= {"0", "1"}  # warm-up: workers started
t0 = time.perf_counter()
ray.get([tiny.remote() for _ in range(TASKS)])
tasks_s = time.perf_counter() - t0
ray.shutdown()
shutil.rmtree(tmp, ignore_errors=True)
print("@@bench@@" + json.dumps({"init_s": init_s, "tasks_per_s": TASKS / tasks_s}))
"""


def _env() -> dict[str, str]:
    drop = {"ACCELREG_RUN", "ACCELREG_AUTO_INSTALL", "LOCAL_RANK", "RANK", "WORLD_SIZE", "ACCELREG_DEVICE_ID"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("ACCELREG_EMU_")}
    env.update(
        ACCELREG_EMU_NAME="npu",
        ACCELREG_EMU_DEVICES="2",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    )
    return env


def run_arm(arm: str, tasks: int, script: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, script, arm, str(tasks)], capture_output=True, text=True, env=_env(), timeout=900
    )
    for line in proc.stdout.splitlines():
        if line.startswith("@@bench@@"):
            return json.loads(line[len("@@bench@@") :])
    raise RuntimeError(
        f"{arm} arm failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="accelreg-bench-ray-")
    script = os.path.join(folder, "arm.py")
    with open(script, "w") as fh:
        fh.write(_ARM)
    samples: dict[str, list[dict[str, float]]] = {"stock": [], "accelreg": []}
    try:
        for r in range(args.rounds):
            order = ("stock", "accelreg") if r % 2 == 0 else ("accelreg", "stock")
            for arm in order:
                samples[arm].append(run_arm(arm, args.tasks, script))
                print(f"round {r + 1} {arm}: {samples[arm][-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    import ray

    def med(arm: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[arm])

    def ratios(key: str) -> list[float]:
        return [a[key] / s[key] for a, s in zip(samples["accelreg"], samples["stock"], strict=True)]

    print(
        f"Ray {ray.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.rounds} paired rounds, {args.tasks} tasks, {time.strftime('%Y-%m-%d')}\n"
    )
    print("| arm | `ray.init()` s | tasks / s |")
    print("| --- | ---: | ---: |")
    for arm in ("stock", "accelreg"):
        print(f"| {arm} | {med(arm, 'init_s'):.2f} | {med(arm, 'tasks_per_s'):.0f} |")
    for key, label in (("init_s", "`ray.init()` time"), ("tasks_per_s", "throughput")):
        values = ratios(key)
        print(
            f"\n{label}, accelreg / stock: median {statistics.median(values):.3f} "
            f"(rounds: {', '.join(f'{v:.3f}' for v in values)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
