"""The controller's Raft port: only the configured address, never unauthenticated (hardening row 1).

Observed before: a pickled `exec` payload sent to the Raft port of a single-node controller with
no secret was executed, and the port listened on 0.0.0.0 whatever the config said. Now a node
without a configured secret generates one (kept in its data dir), PySyncObj authenticates every
peer with it before unpickling anything, and binds only the configured address.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.procs import ControllerCluster, free_address, wait_until
from tidelog.client.controllers import ControllerClient

pytestmark = pytest.mark.slow


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _listening(port: int) -> set[str]:
    """Local addresses listening on `port` (from /proc/net/tcp and tcp6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr_hex, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:  # 0A = LISTEN
                if len(addr_hex) == 8:
                    out.add(socket.inet_ntoa(struct.pack("<I", int(addr_hex, 16))))
                else:
                    out.add(addr_hex)
    return out


def test_a_pickled_payload_on_the_raft_port_does_nothing(
    controller_cluster: Callable[..., ControllerCluster], tmp_path: Path
) -> None:
    cluster = controller_cluster(1, secret=None, start=False)
    proc = cluster.procs["c1"]
    proc.env = {"TIDE_CLUSTER_SECRET": "", "TIDE_CONTROLLER_SECRET": ""}  # like deploy/local.yaml by hand
    proc.start()

    async def answers() -> bool:
        async with ControllerClient(cluster.grpc["c1"]) as c:
            return (await c.cluster_status(address=cluster.grpc["c1"])).node_id == "c1"

    wait_until(lambda: asyncio.run(answers()), 20, what="the controller to serve")
    host, port = cluster.raft["c1"].rsplit(":", 1)
    assert _listening(int(port)) == {host}, f"the Raft port listens on {_listening(int(port))}"

    marker = tmp_path / "executed"
    data = zlib.compress(pickle.dumps(_Payload(marker)), 3)
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(struct.pack("i", len(data)) + data)
            time.sleep(0.3)
    time.sleep(1.0)
    assert not marker.exists(), "the controller executed a payload from an unauthenticated peer"
    assert proc.alive() and asyncio.run(answers())
    assert (cluster.root / "data" / "c1" / "cluster.secret").exists()


def test_a_controller_refuses_to_start_under_python_O(tmp_path: Path) -> None:
    # PySyncObj's checks of what peers send are asserts; -O would remove them silently.
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(
        f"data_dir: {tmp_path / 'data'}\nsecret: a-real-secret-for-this-test-only-0123456789\n"
        f"nodes:\n  - id: c1\n    raft: {free_address()}\n    grpc: {free_address()}\n"
    )
    cfg.chmod(0o600)  # it holds a secret: refused while others can read it
    out = subprocess.run(
        [sys.executable, "-O", "-m", "tidelog.cli", "controller", "--config", str(cfg), "--node-id", "c1"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0
    assert "python -O" in out.stderr and "CONFIG_INVALID" in out.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.log"))
