"""Controllers and broker sets as groups of local processes, for the tests and the benches.

`ControllerCluster` writes one controller config for 1, 3 or 5 nodes on free loopback ports;
`BrokerSet` writes one config per replica of a broker set. Both start and stop their processes
(each by its own pid) and show their logs; `BrokerSet` also answers the readiness questions a
caller waits on before its first write: is there a master, is every replica in its SyncStateSet,
does every replica serve the topic. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from tidelog.localcluster.configs import broker_doc, controller_doc, write_config
from tidelog.localcluster.procs import Proc, free_address, wait_until
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc


class ControllerCluster:
    """1, 3 or 5 controller processes from one generated YAML config in `root`."""

    def __init__(
        self,
        root: Path,
        size: int,
        *,
        secret: str | None,
        heartbeat_interval_ms: int = 500,
        heartbeat_timeout_ms: int = 2000,
        unclean: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.ids = [f"c{i + 1}" for i in range(size)]
        self.grpc = {i: free_address() for i in self.ids}
        self.raft = {i: free_address() for i in self.ids}
        nodes = [{"id": i, "raft": self.raft[i], "grpc": self.grpc[i]} for i in self.ids]
        doc = controller_doc(
            root / "data",
            nodes,
            secret=secret,
            heartbeat_interval_ms=heartbeat_interval_ms,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            enable_elect_unclean_master=unclean,
        )
        doc.update(extra or {})
        self.config_path = write_config(root / "controller.yaml", doc)
        self.procs: dict[str, Proc] = {
            i: Proc(
                f"controller-{i}",
                ["controller", "--config", str(self.config_path), "--node-id", i],
                root / f"{i}.log",
            )
            for i in self.ids
        }

    @property
    def addresses(self) -> list[str]:
        return [self.grpc[i] for i in self.ids]

    @property
    def address_list(self) -> str:
        return ",".join(self.addresses)

    def start(self) -> ControllerCluster:
        for p in self.procs.values():
            p.start()
        return self

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()

    def logs(self, tail: int = 6000) -> str:
        return "\n".join(f"===== {i} =====\n{self.procs[i].output()[-tail:]}" for i in self.ids)

    def id_of(self, grpc_address: str) -> str:
        return next(i for i, a in self.grpc.items() if a == grpc_address)


class BrokerSet:
    """The replicas of broker set `name`, as processes with their configs, data and logs in `root`.

    `log_level` is passed on the command line (a bench measures the broker, not its INFO lines);
    `settings` are deploy/CONFIG.md broker keys written into every replica's config."""

    def __init__(
        self,
        root: Path,
        name: str,
        replicas: int,
        controllers: str,
        *,
        secret: str | None,
        log_level: str | None = None,
        **settings: Any,
    ) -> None:
        self.root = root
        self.name = name
        self.procs: list[Proc] = []
        self.addresses: list[str] = []
        self.ha_addresses: list[str] = []
        self.data_dirs: list[Path] = []
        for i in range(replicas):
            data = root / f"{name}-{i}"
            doc = broker_doc(
                name, data, controllers, free_address(), free_address(), secret=secret, **settings
            )
            cfg = write_config(root / f"{name}-{i}.yaml", doc)
            args = ["broker", "--config", str(cfg), *(["--log-level", log_level] if log_level else [])]
            self.procs.append(Proc(f"{name}-{i}", args, root / f"{name}-{i}.log"))
            self.addresses.append(doc["listen"])
            self.ha_addresses.append(doc["ha_listen"])
            self.data_dirs.append(data)
        self._channels = [grpc.insecure_channel(a) for a in self.addresses]
        self.stubs = [pb_grpc.BrokerStub(c) for c in self._channels]

    def start(self) -> BrokerSet:
        for p in self.procs:
            p.start()
        return self

    def stop(self) -> None:
        """Stop every replica by its pid; safe to call twice."""
        for c in self._channels:
            c.close()
        for p in self.procs:
            p.stop()

    def logs(self, tail: int = 8000) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.output()[-tail:]}" for p in self.procs)

    def status(self, i: int, timeout: float = 1.0) -> pb.StatusReply | None:
        """Replica `i`'s status, or None if it is not running or does not answer."""
        if not self.procs[i].alive():
            return None
        try:
            return self.stubs[i].Status(pb.StatusRequest(), timeout=timeout)
        except Exception:  # not up yet, gone, or its channel closed: no status either way
            return None

    def statuses(self) -> list[pb.StatusReply | None]:
        return [self.status(i) for i in range(len(self.procs))]

    def master_index(self, exclude: int | None = None) -> int | None:
        for i, s in enumerate(self.statuses()):
            if s is not None and s.role == "master" and i != exclude:
                return i
        return None

    def wait_master(self, timeout: float = 20.0, exclude: int | None = None) -> int:
        def found() -> tuple[int] | None:
            i = self.master_index(exclude)
            return None if i is None else (i,)  # a tuple, so that index 0 counts as found

        return wait_until(found, timeout, 0.1, what=f"a master of {self.name}")[0]

    def wait_in_sync(self, count: int | None = None, timeout: float = 30.0) -> int:
        """Wait until the master's SyncStateSet has `count` members (default: every replica);
        returns the master's index."""
        want = len(self.procs) if count is None else count

        def ok() -> tuple[int] | None:
            i = self.master_index()
            s = None if i is None else self.status(i)
            return (i,) if i is not None and s is not None and len(s.sync_state_set) >= want else None

        return wait_until(ok, timeout, 0.2, what=f"{want} in-sync replicas of {self.name}")[0]

    def serves(self, i: int, topic: str) -> bool:
        """Whether replica `i` knows `topic` (brokers learn topics from controller heartbeats)."""
        try:
            self.stubs[i].GetOffsets(pb.GetOffsetsRequest(topic=topic, queue=0), timeout=1.0)
            return True
        except grpc.RpcError:
            return False

    def wait_topic(self, topic: str, indices: list[int] | None = None, timeout: float = 10.0) -> None:
        """Wait until the given replicas (default: all running ones) serve `topic`."""
        which = indices if indices is not None else [i for i, p in enumerate(self.procs) if p.alive()]
        wait_until(
            lambda: all(self.serves(i, topic) for i in which),
            timeout,
            0.1,
            what=f"{topic} to be known to replicas {which}",
        )


def create_topic(controllers: str, topic: str, queues: dict[str, int], timeout: float = 20.0) -> None:
    """Create `topic` (broker set -> queue count) once its broker sets have registered (retried till then)."""
    from tidelog.client.controllers import ControllerClient
    from tidelog.errors import TopicExistsError

    async def attempt() -> bool:
        async with ControllerClient(controllers, rpc_timeout=2.0, total_timeout=3.0) as client:
            try:
                await client.create_topic(topic, queues)
            except TopicExistsError:
                # an earlier attempt whose answer came too late may have made it: the same queues
                # are this call's topic; any other is someone else's
                page, _ = await client.list_topics_page(prefix=topic, limit=1)
                return bool(page) and page[0].name == topic and dict(page[0].queues) == queues
        return True

    wait_until(lambda: asyncio.run(attempt()), timeout, 0.2, what=f"topic {topic} to be created")
