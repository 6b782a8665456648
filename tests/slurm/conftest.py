"""The one-node Slurm cluster the tests in this folder share (see ``_cluster.py``)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._cluster import Cluster, Unavailable


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """slurmctld and slurmd on this machine, idle and ready; both stopped by their process ids
    when the session ends (also after a failed test). Skips, saying why, where Slurm is not
    installed or cannot start."""
    with tempfile.TemporaryDirectory(prefix="accelreg-slurm-") as root:
        cluster = Cluster(Path(root))
        try:
            cluster.start()
        except Unavailable as exc:
            cluster.stop()
            pytest.skip(f"no Slurm cluster: {exc}")
        try:
            yield cluster
        finally:
            cluster.stop()
