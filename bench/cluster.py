"""A throwaway tidelog cluster for benchmarks: one controller and one broker set on loopback.

`BenchCluster` writes the YAML configs into a directory of its own, starts every process with
`python -m tidelog.cli ...` through the test harness's `Proc` (each stopped by its own pid:
SIGTERM, then SIGKILL), creates the bench topic and waits until the master's SyncStateSet holds
every replica, so the first timed write is already replicated synchronously. Nothing listens
beyond 127.0.0.1.

Typical use:

    with BenchCluster(workdir, broker_options={"flush": "async"}) as cluster:
        cluster.wait_ready("bench", queues=8)
        ... cluster.master_address, cluster.slave_address, cluster.pids ...
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import yaml

from tests.procs import CLUSTER_SECRET, Proc, free_address, wait_until
from tidelog.controller.client import ControllerClient
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc


class BenchCluster:
    """One controller process and `replicas` broker processes of broker set `broker_set`."""

    def __init__(self, root: Path, *, broker_set: str = "broker-a", replicas: int = 2,
                 broker_options: dict[str, Any] | None = None, log_level: str = "WARNING") -> None:
        self.root = root
        self.broker_set = broker_set
        self.controller_address = free_address()
        controller_doc = {
            "data_dir": str(root / "controller"),
            "heartbeat_interval_ms": 500,
            "heartbeat_timeout_ms": 3000,
            "enable_elect_unclean_master": False,
            "secret": CLUSTER_SECRET,
            "nodes": [{"id": "c1", "raft": free_address(), "grpc": self.controller_address}],
        }
        (root / "controller.yaml").write_text(yaml.safe_dump(controller_doc))
        self.controller = Proc("controller", ["controller", "--config", str(root / "controller.yaml"),
                                              "--node-id", "c1"], root / "controller.log")
        self.brokers: list[Proc] = []
        self.addresses: list[str] = []
        for i in range(replicas):
            doc: dict[str, Any] = {
                "broker_set": broker_set,
                "data_dir": str(root / f"{broker_set}-{i}"),
                "controllers": self.controller_address,
                "listen": free_address(),
                "ha_listen": free_address(),
                "secret": CLUSTER_SECRET,
            }
            doc.update(broker_options or {})
            cfg = root / f"{broker_set}-{i}.yaml"
            cfg.write_text(yaml.safe_dump(doc))
            # WARNING by default: the bench measures the broker, not its INFO lines.
            self.brokers.append(Proc(f"{broker_set}-{i}", ["broker", "--config", str(cfg), "--log-level", log_level],
                                     root / f"{broker_set}-{i}.log"))
            self.addresses.append(doc["listen"])
        self._channels = [grpc.insecure_channel(a) for a in self.addresses]
        self._stubs = [pb_grpc.BrokerStub(c) for c in self._channels]
        self.master_index = -1

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> BenchCluster:
        self.controller.start()
        for p in self.brokers:
            p.start()
        return self

    def stop(self) -> None:
        """Stop every process this cluster started, each by its pid; safe to call twice."""
        for c in self._channels:
            c.close()
        for p in [*self.brokers, self.controller]:
            p.stop()

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pids(self) -> dict[str, int]:
        """Role -> pid of the running processes ("controller", "master", "slave" or "slave-N")."""
        out = {"controller": self.controller.pid}
        slaves = [i for i in range(len(self.brokers)) if i != self.master_index]
        if self.master_index >= 0:
            out["master"] = self.brokers[self.master_index].pid
        for n, i in enumerate(slaves):
            out["slave" if len(slaves) == 1 else f"slave-{n}"] = self.brokers[i].pid
        return out

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.output()[-tail:]}" for p in [self.controller, *self.brokers])

    # ------------------------------------------------------------------ readiness

    def status(self, i: int) -> pb.StatusReply | None:
        if not self.brokers[i].alive():
            return None
        try:
            return self._stubs[i].Status(pb.StatusRequest(), timeout=1.0)
        except grpc.RpcError:
            return None

    def create_topic(self, topic: str, queues: int, timeout: float = 20.0) -> None:
        """Create `topic` with `queues` queues here; retried until the broker set is registered."""
        async def create() -> bool:
            async with ControllerClient(self.controller_address) as client:
                await client.create_topic(topic, {self.broker_set: queues})
            return True

        wait_until(lambda: asyncio.run(create()), timeout, 0.5, what=f"topic {topic} created")

    def wait_ready(self, topic: str, queues: int, timeout: float = 30.0) -> None:
        """Topic created, one master, every replica in its SyncStateSet, topic known to the brokers."""
        deadline = time.monotonic() + timeout
        self.create_topic(topic, queues, timeout)

        def in_sync() -> tuple[int] | None:
            for i in range(len(self.brokers)):
                s = self.status(i)
                if s is not None and s.role == "master" and len(s.sync_state_set) == len(self.brokers):
                    return (i,)
            return None

        self.master_index = wait_until(in_sync, max(1.0, deadline - time.monotonic()), 0.2,
                                       what="a master with every replica in sync")[0]

        # The brokers learn topics from controller heartbeats: wait until every replica serves it.
        def known(i: int) -> bool:
            try:
                self._stubs[i].GetOffsets(pb.GetOffsetsRequest(topic=topic, queue=0), timeout=1.0)
                return True
            except grpc.RpcError:
                return False

        wait_until(lambda: all(known(i) for i in range(len(self.brokers))),
                   max(1.0, deadline - time.monotonic()), 0.2, what=f"topic {topic} on every replica")

    def in_sync_count(self) -> int:
        """Members of the master's SyncStateSet now (0 if the master does not answer)."""
        s = self.status(self.master_index)
        return len(s.sync_state_set) if s is not None and s.role == "master" else 0

    def sync_state_set_epoch(self) -> int:
        """The master's SyncStateSet epoch: it moves whenever the set shrinks or grows."""
        s = self.status(self.master_index)
        return s.sync_state_set_epoch if s is not None else -1

    def wait_in_sync(self, timeout: float = 30.0) -> None:
        """Wait until every replica is back in the master's SyncStateSet (after a shrink under load)."""
        wait_until(lambda: self.in_sync_count() == len(self.brokers), timeout, 0.2,
                   what="every replica back in the SyncStateSet")

    @property
    def master_address(self) -> str:
        assert self.master_index >= 0, "wait_ready() first"
        return self.addresses[self.master_index]

    @property
    def slave_address(self) -> str:
        assert self.master_index >= 0, "wait_ready() first"
        return next(a for i, a in enumerate(self.addresses) if i != self.master_index)

    def queue_offsets(self, address: str, topic: str, queue: int) -> pb.QueueOffsets:
        stub = self._stubs[self.addresses.index(address)]
        return stub.GetOffsets(pb.GetOffsetsRequest(topic=topic, queue=queue), timeout=5.0).offsets
