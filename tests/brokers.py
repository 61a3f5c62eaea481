"""Broker processes for multi-process tests, and a small synchronous gRPC client to drive them.

`BrokerSetProcs` is tidelog.localcluster's `BrokerSet` (one config per replica on free loopback
ports, every process stopped by its own pid) with the tests' settings and a client per replica.
`BrokerClient` calls one broker's gRPC API and raises tidelog's typed errors.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from tests.procs import CLUSTER_SECRET, Proc
from tidelog import localcluster
from tidelog.localcluster import create_topic
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc
from tidelog.wire import error_from_rpc

__all__ = [
    "BrokerClient",
    "BrokerSetProcs",
    "create_topic",
    "pause",
    "read_queues",
    "resume",
    "retry_produce",
    "status_of",
    "wait_topic",
]

# Short failure detection, so a test's failover happens in seconds; small segments, so tests roll them.
TEST_BROKER_SETTINGS: dict[str, Any] = {
    "segment_bytes": 1 << 20,
    "heartbeat_interval_ms": 300,
    "ha_heartbeat_interval_ms": 300,
    "ha_idle_timeout_ms": 3000,
    "slave_timeout_ms": 3000,
    "ha_max_time_slave_not_catchup_ms": 4000,
}


class BrokerClient:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.BrokerStub(self.channel)

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise _typed(exc) from None

    def produce(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        key: str | None = None,
        queue: int | None = None,
        timeout: float | None = None,
    ) -> pb.ProduceReply:
        msgs = []
        for b in bodies:
            m = pb.ProduceMessage(body=b)
            if key is not None:
                m.key = key
            if queue is not None:
                m.queue = queue
            msgs.append(m)
        return self._call("Produce", pb.ProduceRequest(topic=topic, messages=msgs), timeout)

    def pull(
        self, topic: str, queue: int, offset: int, max_messages: int = 1000, wait_ms: int = 0
    ) -> pb.PullReply:
        return self._call(
            "Pull",
            pb.PullRequest(
                topic=topic, queue=queue, offset=offset, max_messages=max_messages, wait_ms=wait_ms
            ),
        )

    def pull_all(self, topic: str, queue: int, start: int = 0) -> list[pb.PulledMessage]:
        out: list[pb.PulledMessage] = []
        offset = start
        while True:
            reply = self.pull(topic, queue, offset)
            if not reply.messages:
                return out
            out.extend(reply.messages)
            offset = reply.next_offset

    def offsets(self, topic: str, queue: int) -> pb.QueueOffsets:
        return self._call("GetOffsets", pb.GetOffsetsRequest(topic=topic, queue=queue)).offsets

    def commit(self, group: str, topic: str, queue: int, offset: int) -> None:
        self._call(
            "CommitOffset", pb.CommitOffsetRequest(group=group, topic=topic, queue=queue, offset=offset)
        )

    def commit_many(self, commits: list[tuple[str, str, int, int]]) -> None:
        """(group, topic, queue, offset) of each commit, in one `CommitOffsets` call."""
        self._call(
            "CommitOffsets",
            pb.CommitOffsetsRequest(
                commits=[
                    pb.CommitOffsetRequest(group=g, topic=t, queue=q, offset=o) for g, t, q, o in commits
                ]
            ),
        )

    def fetch(self, group: str, topic: str, queue: int) -> int | None:
        r = self._call("FetchOffset", pb.FetchOffsetRequest(group=group, topic=topic, queue=queue))
        return r.offset if r.found else None

    def status(self, timeout: float = 2.0) -> pb.StatusReply:
        return self._call("Status", pb.StatusRequest(), timeout)

    def close(self) -> None:
        self.channel.close()


def _typed(exc: grpc.RpcError) -> Exception:
    # error_from_rpc reads trailing metadata through the aio type's interface, which sync errors share
    code = None
    try:
        for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
            if key == "tidelog-error-code":
                code = value
    except Exception:
        pass
    if code:
        from tidelog.wire import make_error

        return make_error(code, exc.details() or "")  # type: ignore[attr-defined]
    return error_from_rpc(exc)


class BrokerSetProcs(localcluster.BrokerSet):
    """The replicas of one broker set, as processes, with the tests' short timeouts and secret,
    and a `BrokerClient` per replica."""

    def __init__(self, root: Path, name: str, replicas: int, controllers: str, **options: Any) -> None:
        settings = {**TEST_BROKER_SETTINGS, **options}
        super().__init__(
            root, name, replicas, controllers, secret=settings.pop("secret", CLUSTER_SECRET), **settings
        )
        self.clients = [BrokerClient(a) for a in self.addresses]

    def stop(self) -> None:
        super().stop()
        for c in self.clients:
            c.close()


def retry_produce(
    client_for: Any, topic: str, body: bytes, deadline_s: float, **kw: Any
) -> pb.ProduceReply | None:
    """Send until acknowledged or the deadline passes; `client_for()` names the current master client."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        c = client_for()
        if c is not None:
            try:
                return c.produce(topic, [body], **kw)
            except Exception:
                pass
        time.sleep(0.05)
    return None


# --- helpers for the multi-process broker/HA tests (tests/broker/) ---------------------------------


def wait_topic(
    bs: BrokerSetProcs, topic: str, indices: list[int] | None = None, timeout: float = 10.0
) -> None:
    """Wait until the given replicas (default: all running ones) serve `topic`."""
    bs.wait_topic(topic, indices, timeout)


def pause(proc: Proc) -> None:
    """SIGSTOP: the process keeps its sockets but answers nothing."""
    import os
    import signal

    os.kill(proc.pid, signal.SIGSTOP)


def resume(proc: Proc) -> None:
    import os
    import signal

    if proc.alive():
        os.kill(proc.pid, signal.SIGCONT)


def status_of(bs: BrokerSetProcs, i: int, timeout: float = 1.0) -> pb.StatusReply | None:
    """Status of replica `i`, or None if it does not answer."""
    try:
        return bs.clients[i].status(timeout=timeout)
    except Exception:
        return None


def read_queues(client: BrokerClient, topic: str, queues: int) -> dict[int, list[bytes]]:
    """Every confirmed body of every queue of `topic` on one replica, in queue order."""
    return {q: [m.body for m in client.pull_all(topic, q)] for q in range(queues)}


def commitlog_prefix(data_dir: Path, end: int) -> bytes:
    """The bytes [0, end) of the commit log in `data_dir`, read from its segment files."""
    import os

    cl = data_dir / "commitlog"
    segments = sorted((int(p.name), p) for p in cl.iterdir() if p.name.isdigit())
    out = bytearray()
    for base, path in segments:
        if base >= end:
            break
        assert base == len(out), f"{path} starts at {base}, expected a segment at {len(out)}"
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            want = end - base
            if segments[-1][0] != base:  # not the last one: a whole segment, or up to `end`
                want = min(want, size)
            chunk = f.read(want)
        assert len(chunk) == want, f"{path} holds {len(chunk)} bytes, expected {want}"
        out += chunk
    assert len(out) == end, f"the segments in {cl} end at {len(out)}, before {end}"
    return bytes(out)
