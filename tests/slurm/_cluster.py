"""A real one-node Slurm cluster for the tests, from Debian's packages (``slurm-wlm``).

Measured facts it relies on (Slurm 22.05.8): as root, ``slurmctld -D`` and ``slurmd -D -N
localhost`` run with a private ``slurm.conf`` (``AuthType=auth/none``, ``CredType=cred/none``:
no munged), private ports, and state, spool, pid and log files in a temporary folder. GRES need
character device files (``mknod``; nothing opens them): a plain file is counted but then no
variable is set, and a ``gpu`` entry without ``File=`` is dropped and drains the node. The
node's name is ``localhost`` (``-N``), whatever this machine's hostname. A client whose
controller is gone retries for minutes, so every client call here has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accelreg.testing import emu_environ

#: Each emulated physical device has its own size, so a task's capacity names its device.
MEMORY = "1GiB,2GiB"
GiB = 1 << 30
CLIENT_TIMEOUT = 20.0
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "squeue", "sinfo", "scancel")

CONF = """\
ClusterName=accreg{tag}
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,npu
MpiDefault=none
ReturnToService=2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:2,npu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
GRES = """\
NodeName=localhost Name=gpu File={root}/dev/gpu[0-1]
NodeName=localhost Name=npu File={root}/dev/npu[0-1]
"""


class Unavailable(Exception):
    """Why this machine cannot run the cluster (the tests skip with it)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """slurmctld and slurmd of one node, started by :meth:`start` and stopped by their own
    process ids in :meth:`stop`; :meth:`run` runs a client under a timeout."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = root / "slurm.conf"
        env = emu_environ("npu", 2, memory=MEMORY)
        env = {k: v for k, v in env.items() if not k.startswith(("SLURM", "SBATCH_", "SRUN_", "SALLOC_"))}
        bindir = os.path.dirname(sys.executable)  # this environment's python and accelreg first
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env["SLURM_CONF"] = str(self.conf)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env

    # -- life ---------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
        if missing:
            raise Unavailable(
                f"Slurm is not installed ({', '.join(missing)} not on PATH): Debian's slurm-wlm provides it "
                "(.ci/run installs it with apt-get)"
            )
        if os.geteuid() != 0:
            raise Unavailable("a one-node Slurm cluster needs root here (slurmd, mknod of GRES device files)")
        for sub in ("state", "spool", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            for kind, major in (("gpu", 241), ("npu", 240)):
                for i in range(2):
                    path = self.root / "dev" / f"{kind}{i}"
                    if not path.exists():
                        os.mknod(path, 0o600 | 0o020000, os.makedev(major, i))
        except OSError as exc:
            raise Unavailable(f"cannot create GRES device files with mknod: {exc}") from None
        fields = {"root": self.root, "ctld_port": _port(), "d_port": _port(), "tag": os.getpid() % 100000}
        self.conf.write_text(CONF.format(**fields))
        (self.root / "gres.conf").write_text(GRES.format(**fields))
        for name, args in (("slurmctld", ["-D", "-i"]), ("slurmd", ["-D", "-N", "localhost"])):
            with open(self.root / "log" / f"{name}.out", "wb") as out:
                self.procs[name] = subprocess.Popen(
                    [name, *args, "-f", str(self.conf)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise Unavailable(f"{name} exited with status {proc.returncode}: {self.logs()}")
            try:
                state = self.run("sinfo", "-h", "-n", "localhost", "-o", "%T", timeout=5).stdout.strip()
            except subprocess.TimeoutExpired:
                state = "(sinfo timed out)"
            if state == "idle":
                return
            time.sleep(0.2)
        raise Unavailable(
            f"the node did not become idle within {timeout:g} s (state {state!r}): {self.logs()}"
        )

    def stop(self) -> None:
        """Cancel what still runs, then stop both daemons by their process ids."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--user", "root", timeout=5)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and self.run("squeue", "-h", timeout=5).stdout.strip():
                    time.sleep(0.2)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def logs(self, tail: int = 2000) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")[-tail:]
            out.append(f"--- {path.name}:\n{text}")
        return "\n".join(out)

    # -- clients ------------------------------------------------------------------------------
    def run(
        self, *args: str, timeout: float = CLIENT_TIMEOUT, env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client (or any command) in the cluster's environment, under ``timeout``."""
        return subprocess.run(
            list(args),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            **kw,
        )

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """A client started in the background (stopped by the caller, by its handle)."""
        return subprocess.Popen(
            list(args),
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.root,
        )

    def wait_job(self, job: str, timeout: float = 180.0) -> str:
        """Wait until batch job ``job`` has ended; its final state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run("scontrol", "-o", "show", "job", job, timeout=5).stdout
            state = next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.3)
        raise AssertionError(f"job {job} still {state!r} after {timeout:g} s")


def records(folder: Path) -> list[dict[str, Any]]:
    """The probe's records in ``folder`` (one JSON file per task), by task."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(rows, key=lambda r: (r.get("job", ""), int(r["task"])))


def physical(row: dict[str, Any]) -> int:
    """The physical emulated device a probe record ran on (from its capacity)."""
    return row["capacity"] // GiB - 1
