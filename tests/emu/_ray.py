"""Ray on the emulated accelerator: drivers and nodes in processes of their own, always stopped.

One emulated backend name per process, and Ray's workers inherit their raylet's environment, so
each Ray cluster of a test runs the emulator under one name: a *driver script* (``check_*``
functions, like :mod:`._runner`'s) runs in a subprocess that starts its own local Ray
(``ray.init`` in the script, with Ray's own fate-sharing: the cluster dies with the driver), or
connects to nodes started with ``accelreg run -- ray start --block`` (:class:`RayNode`, stopped
by its own process handle — SIGTERM, which ``--block`` answers by stopping what it started — and
its process group, never ``ray stop``, which stops every Ray on the machine).

Ray is kept small: at most 2 CPUs in a cluster, an 80 MiB object store, no dashboard, usage
statistics and token authentication off (a loopback-only cluster), every node on 127.0.0.1 with
its own ``--temp-dir``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from accelreg.testing import clean_environ

from ._runner import _HARNESS, check_results

__all__ = ["RayNode", "free_port", "ray_checks", "ray_environ", "ray_temp_dir"]

OBJECT_STORE = 80 << 20
#: Environment every Ray process of the tests gets.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # a loopback-only test cluster: no token (Ray would read and write ~/.ray/auth_token)
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_temp_dir() -> str:
    """A short temporary folder (Ray's socket paths must stay under 107 characters)."""
    return tempfile.mkdtemp(prefix="ar-", dir="/tmp")


def ray_environ(name: str | None, devices: int = 2, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment with the emulator as ``name`` x ``devices`` (``None``: off)."""
    env = clean_environ(RAY_ENV)
    for key in [k for k in env if k.startswith("ACCELREG_EMU_")]:
        del env[key]
    if name is not None:
        env["ACCELREG_EMU_NAME"] = name
        env["ACCELREG_EMU_DEVICES"] = str(devices)
    env.update(extra or {})
    return env


def _accelreg_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelreg", "run", *args, "--"]


def ray_checks(
    script: str,
    name: str | None,
    *,
    devices: int = 2,
    under_run: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> dict[str, str]:
    """Run every ``check_*`` function of ``script`` in one driver process; ``{check: "ok" or the
    traceback}``. ``under_run``: the driver is started as ``accelreg run <under_run> -- python
    script`` (no ``install()`` in the script needed); else as plain ``python script``.

    The script's own prologue starts (or joins) Ray; a driver killed at the timeout takes its
    local cluster with it (Ray's fate-sharing of the processes a driver started).
    """
    folder = Path(tempfile.mkdtemp(prefix="accelreg-ray-"))
    path = folder / "driver.py"
    path.write_text(textwrap.dedent(script) + _HARNESS)
    prefix = _accelreg_run(*under_run) if under_run is not None else []
    env = ray_environ(name, devices, extra_env)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=folder,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return check_results(proc, script, f"driver (emulator {name} x {devices})")


class RayNode:
    """One Ray node: ``accelreg run -- ray start ... --block`` in a process group of its own.

    ``head`` starts a cluster (GCS on 127.0.0.1:``port``); otherwise the node joins ``address``.
    :meth:`stop` ends it by its own handle (always: use it as a context manager).
    """

    def __init__(
        self,
        *,
        name: str,
        devices: int,
        head: bool,
        port: int | None = None,
        address: str | None = None,
        num_cpus: int = 1,
    ) -> None:
        self.temp_dir = ray_temp_dir()
        self.port = port
        ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
        if ray is None:
            raise RuntimeError("Ray's `ray` command is not installed beside this Python")
        cmd = [
            *_accelreg_run(),
            ray,
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        if head:
            cmd += ["--head", f"--port={port}", "--include-dashboard=false"]
        else:
            cmd += [f"--address={address}"]
        self.log = open(os.path.join(self.temp_dir, "ray-start.log"), "w+")
        self.proc = subprocess.Popen(
            cmd,
            env=ray_environ(name, devices),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_started(self, timeout: float = 180) -> None:
        """Until ``ray start`` says the node is up (it then blocks); raises with its output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()
            if "Ray runtime started" in text:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"ray start did not come up (exit {self.proc.poll()}):\n{self.output()[-6000:]}")

    def stop(self) -> None:
        """SIGTERM to ``ray start --block`` (it stops the processes it started), then the
        leftovers of its own process group; never anything else."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own group: the pid is the group's id
        except (ProcessLookupError, PermissionError):
            pass
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
