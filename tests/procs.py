"""The tests' view of tidelog.localcluster: its process harness with the tests' cluster secret.

Every process is started and stopped by tidelog.localcluster (free loopback ports, one log file
each, stopped by its own pid); this module only fixes what every test cluster shares.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    "tide",
    "wait_until",
]

#: `tide` as the tests run it: this interpreter's module, whatever PATH holds.
TIDE_MODULE = (sys.executable, "-m", "tidelog.cli")

# The cluster secret every test cluster shares (controllers and brokers alike).
CLUSTER_SECRET = "test-cluster-secret"


class ControllerCluster(localcluster.ControllerCluster):
    """1, 3 or 5 controller processes sharing CLUSTER_SECRET unless told otherwise (`secret=None`: none)."""

    def __init__(self, root: Path, size: int, *, secret: str | None = CLUSTER_SECRET, **options: Any) -> None:
        super().__init__(root, size, secret=secret, **options)


def tide(
    *args: str,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
    program: Sequence[str] = TIDE_MODULE,
) -> subprocess.CompletedProcess[str]:
    """Run `tide ARGS` to completion, bounded by `timeout`, its output captured as text: the one
    way the tests call the command line. `env` is the whole environment (None: this process's);
    stdin is `input`, else empty; `program` is how `tide` is started."""
    return subprocess.run(
        [*program, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        env=None if env is None else dict(env),
        check=False,
    )
