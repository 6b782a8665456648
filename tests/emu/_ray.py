"""Ray on the emulated accelerator: clusters started by the test's own child process, always stopped.

One emulated backend name per process, and Ray's workers inherit their raylet's environment, so
each Ray cluster of a test runs the emulator under one name: the tests of one cluster run in one
child process of the ``accelreg_emu`` marker (the driver), which starts its own local Ray
(:func:`local_ray`, stopped by ``ray.shutdown()`` in the same process, with Ray's own
fate-sharing as the back-stop: the cluster dies with the driver), or connects to nodes started
with ``accelreg run -- ray start --block`` (:class:`RayNode`, stopped by its own process handle —
SIGTERM, which ``--block`` answers by stopping what it started — and its process group, never
``ray stop``, which stops every Ray on the machine; on Linux the node also gets SIGTERM when
the process that started it dies, so a child stopped at its timeout leaves no node behind).

Ray is kept small: at most 2 CPUs in a cluster, an 80 MiB object store, no dashboard, usage
statistics and token authentication off (a loopback-only cluster), every node on 127.0.0.1 with
its own ``--temp-dir``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping

from accelreg.testing import clean_environ

__all__ = ["RAY_ENV", "RayNode", "free_port", "local_ray", "ray_environ", "ray_temp_dir"]

OBJECT_STORE = 80 << 20
#: Environment every Ray process of the tests gets (the drivers through their marker's ``**env``).
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
    """A clean environment with the emulator as ``name`` x ``devices`` (``None``: off).

    The emulator's build cache (``ACCELREG_EMU_CACHE``) stays: the node's workers load the
    extension the session built. The testing plugin's variables of a marker's child go: a node
    is no child of the plugin.
    """
    env = clean_environ(RAY_ENV)
    for key in [k for k in env if k.startswith(("ACCELREG_EMU_", "ACCELREG_TESTING_"))]:
        if key != "ACCELREG_EMU_CACHE":
            del env[key]
    if name is not None:
        env["ACCELREG_EMU_NAME"] = name
        env["ACCELREG_EMU_DEVICES"] = str(devices)
    env.update(extra or {})
    return env


def _accelreg_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelreg", "run", *args, "--"]


@contextlib.contextmanager
def local_ray() -> Iterator[None]:
    """This process's own local Ray (2 CPUs, its own temporary folder), for a driver whose
    environment the marker set: stopped by ``ray.shutdown()`` here and its folder removed."""
    import ray

    temp_dir = ray_temp_dir()
    try:
        ray.init(
            num_cpus=2,
            object_store_memory=OBJECT_STORE,
            _temp_dir=temp_dir,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _end_with_parent() -> Callable[[], object] | None:
    """On Linux, what a node's process runs before it starts: it gets SIGTERM when the process
    that started it dies (``prctl(PR_SET_PDEATHSIG)``; looked up here, before the fork)."""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


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
            preexec_fn=_end_with_parent(),
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
