"""A throwaway tidelog cluster for benchmarks: one controller and one broker set on loopback.

`BenchCluster` is tidelog.localcluster's `ControllerCluster` and `BrokerSet` in a directory of
their own (every process stopped by its own pid: SIGTERM, then SIGKILL), with the bench's waits:
it creates the bench topic and waits until the master's SyncStateSet holds every replica, so the
first timed write is already replicated synchronously. Nothing listens beyond 127.0.0.1.

Typical use:

    with BenchCluster(workdir, broker_options={"flush": "async"}) as cluster:
        cluster.wait_ready("bench", queues=8)
        ... cluster.master_address, cluster.slave_address, cluster.pids ...
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tidelog.clusterauth import new_secret
from tidelog.invariants import require
from tidelog.localcluster import BrokerSet, ControllerCluster, Proc, create_topic, wait_until
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

#: The broker settings the benches measure unless they say otherwise: every write acknowledged by
#: both replicas while both are in sync, flushed to disk in the background.
SYNC_REPLICATED: dict[str, Any] = {
    "replication": "sync",
    "in_sync_replicas": 2,
    "auto_in_sync_replicas": True,
    "flush": "async",
}


class BenchCluster:
    """One controller process and `replicas` broker processes of broker set `broker_set`."""

    def __init__(
        self,
        root: Path,
        *,
        broker_set: str = "broker-a",
        replicas: int = 2,
        broker_options: dict[str, Any] | None = None,
        log_level: str = "WARNING",
    ) -> None:
        self.root = root
        self.broker_set = broker_set
        secret = new_secret()
        (root / "controller").mkdir(parents=True, exist_ok=True)
        self._controllers = ControllerCluster(
            root / "controller", 1, secret=secret, heartbeat_timeout_ms=3000
        )
        self.controller_address = self._controllers.address_list
        # WARNING by default: the bench measures the broker, not its INFO lines.
        self._set = BrokerSet(
            root,
            broker_set,
            replicas,
            self.controller_address,
            secret=secret,
            log_level=log_level,
            **(broker_options or {}),
        )
        self.master_index = -1

    @property
    def controller(self) -> Proc:
        return self._controllers.procs["c1"]

    @property
    def brokers(self) -> list[Proc]:
        return self._set.procs

    @property
    def addresses(self) -> list[str]:
        return self._set.addresses

    @property
    def stubs(self) -> list[pb_grpc.BrokerStub]:
        """A blocking gRPC stub per replica, in the order of `brokers`."""
        return self._set.stubs

    @property
    def data_dirs(self) -> list[Path]:
        """Each replica's data directory, in the order of `brokers`."""
        return self._set.data_dirs

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> BenchCluster:
        self._controllers.start()
        self._set.start()
        return self

    def stop(self) -> None:
        """Stop every process this cluster started, each by its pid; safe to call twice."""
        self._set.stop()
        self._controllers.stop()

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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
        return self._controllers.logs(tail) + "\n" + self._set.logs(tail)

    # ------------------------------------------------------------------ readiness

    def status(self, i: int) -> pb.StatusReply | None:
        return self._set.status(i)

    def create_topic(self, topic: str, queues: int, timeout: float = 20.0) -> None:
        """Create `topic` with `queues` queues here; retried until the broker set is registered."""
        create_topic(self.controller_address, topic, {self.broker_set: queues}, timeout)

    def wait_ready(self, topic: str, queues: int, timeout: float = 30.0) -> None:
        """Topic created, one master, every replica in its SyncStateSet, topic known to the brokers."""
        deadline = time.monotonic() + timeout
        self.create_topic(topic, queues, timeout)
        self.master_index = self._set.wait_in_sync(timeout=max(1.0, deadline - time.monotonic()))
        self._set.wait_topic(topic, list(range(len(self.brokers))), max(1.0, deadline - time.monotonic()))

    def wait_topic(self, topic: str, timeout: float = 30.0) -> None:
        """Wait until every replica serves `topic` (the heartbeats carried it)."""
        self._set.wait_topic(topic, list(range(len(self.brokers))), timeout)

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
        wait_until(
            lambda: self.in_sync_count() == len(self.brokers),
            timeout,
            0.2,
            what="every replica back in the SyncStateSet",
        )

    @property
    def master_address(self) -> str:
        require(self.master_index >= 0, "wait_ready() first")
        return self.addresses[self.master_index]

    @property
    def slave_address(self) -> str:
        require(self.master_index >= 0, "wait_ready() first")
        return next(a for i, a in enumerate(self.addresses) if i != self.master_index)

    def queue_offsets(self, address: str, topic: str, queue: int) -> pb.QueueOffsets:
        stub = self._set.stubs[self.addresses.index(address)]
        return stub.GetOffsets(pb.GetOffsetsRequest(topic=topic, queue=queue), timeout=5.0).offsets
