"""The tests' view of tidelog.localcluster: its process harness with the tests' cluster secret.

Every process is started and stopped by tidelog.localcluster (free loopback ports, one log file
each, stopped by its own pid); this module only fixes what every test cluster shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidelog import localcluster
from tidelog.localcluster import LOOPBACK, Proc, free_address, free_port, wait_until

__all__ = [
    "CLUSTER_SECRET",
    "LOOPBACK",
    "ControllerCluster",
    "Proc",
    "free_address",
    "free_port",
    "wait_until",
]

# The cluster secret every test cluster shares (controllers and brokers alike).
CLUSTER_SECRET = "test-cluster-secret"


class ControllerCluster(localcluster.ControllerCluster):
    """1, 3 or 5 controller processes sharing CLUSTER_SECRET unless told otherwise (`secret=None`: none)."""

    def __init__(self, root: Path, size: int, *, secret: str | None = CLUSTER_SECRET, **options: Any) -> None:
        super().__init__(root, size, secret=secret, **options)
