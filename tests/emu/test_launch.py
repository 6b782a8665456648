"""torchrun on the emulated accelerator: each rank resolves its own device and all-reduces a
tensor on it over the backend's declared collective backend, and a visible-device mask that
skips a physical device keeps rank -> physical device right (issue 7). The 2-node launch is in
tests/deepspeed/test_multinode.py."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from accelreg.testing import emu_environ, run_python

pytestmark = pytest.mark.emu

RANK = str(Path(__file__).with_name("_rank.py"))
GiB = 1 << 30


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(env: dict[str, str], *prefix: str) -> list[dict]:
    results = Path(tempfile.mkdtemp(prefix="accelreg-ranks-"))
    env = {**env, "RANK_RESULTS": str(results)}
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_port()),
        RANK,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        files = sorted(results.glob("rank*.json"))
        assert len(files) == 2, (files, proc.stdout[-3000:])
        rows = [json.loads(f.read_text()) for f in files]
    finally:
        shutil.rmtree(results, ignore_errors=True)
    return sorted(rows, key=lambda r: r["rank"])


def _check(rows: list[dict], capacities: list[int]) -> None:
    for row in rows:
        assert row["device"] == f"npu:{row['local_rank']}"
        assert row["capacity"] == capacities[row["local_rank"]]
        assert row["allocated"] >= 1024 * 4
        assert row["all_reduce"] == 1024 * (1 + 2)  # both ranks took part
        assert row["all_reduce_device"] == row["device"] and row["dist_backend"] == "hccl"
        assert row["deepspeed"] == "npu" and row["deepspeed_device"] == row["device"]


def test_two_ranks_each_resolve_their_own_device():
    env = emu_environ("npu", 2, "1GiB,2GiB")
    rows = _torchrun(env)
    _check(rows, [1 * GiB, 2 * GiB])
    assert rows[0]["visible"] is None


@pytest.mark.slow  # three emulated devices under torchrun; two ranks run in the default set above
def test_mask_that_skips_a_physical_device():
    # physical devices 0, 1, 2 with distinct capacities; the job gets 0 and 2
    env = emu_environ("npu", 3, "1GiB,2GiB,3GiB")
    rows = _torchrun(
        env, sys.executable, "-m", "accelreg", "run", "--backend", "npu", "--devices", "0,2", "--"
    )
    _check(rows, [1 * GiB, 3 * GiB])  # rank 1 is physical 2, not physical 1
    assert rows[1]["visible"] == ["0", "2"]


def test_local_rank_past_the_visible_devices_is_an_error_not_device_0():
    code = (
        "import accelreg\n"
        "try:\n    accelreg.resolve()\nexcept accelreg.DeviceError as e:\n    print(str(e))\n"
        "else:\n    raise SystemExit('resolved a device')\n"
    )
    out = run_python(code, name="npu", devices=2, env={"LOCAL_RANK": "2"}).stdout
    assert "LOCAL_RANK=2, but npu has 2 devices (npu:0, npu:1)" in out
    assert "ASCEND_RT_VISIBLE_DEVICES" in out


def test_visible_devices_env_helper_under_the_emulator():
    code = "import json, accelreg\nprint(json.dumps(accelreg.visible_devices_env(None, [2, 0])))\n"
    assert run_python(code, name="mlu", devices=3).value == {"MLU_VISIBLE_DEVICES": "2,0"}
