"""Reads and group offsets over real processes: a Pull reply stays bounded whatever the request
asks for, and a committed group offset past the queue's end is refused."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import _typed
from tests.procs import wait_until
from tidelog.client import Client
from tidelog.errors import InvalidArgumentError
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MAX_PULL_BYTES = 16 << 20  # the documented default of `max_pull_bytes`
BODY = 128 << 10
COUNT = 320  # 40 MiB in one queue: more than two full replies


def _hwm_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_a_pull_asking_for_2_62_bytes_gets_a_bounded_reply_and_nothing_is_lost(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    c = broker_cluster(2)
    m = c.bs.wait_in_sync(2)
    master = c.bs.clients[m]
    bodies = [i.to_bytes(4, "big") * (BODY // 4) for i in range(COUNT)]
    for i in range(0, COUNT, 8):
        master.produce(TOPIC, bodies[i : i + 8], queue=0)
    wait_until(lambda: master.offsets(TOPIC, 0).confirmed == COUNT, 20, what="every message confirmed")

    channel = grpc.insecure_channel(
        c.bs.addresses[m], options=[("grpc.max_receive_message_length", 256 << 20)]
    )
    stub = pb_grpc.BrokerStub(channel)
    try:
        pid = c.bs.procs[m].pid
        before = _hwm_bytes(pid)
        huge = pb.PullRequest(topic=TOPIC, queue=0, offset=0, max_messages=2**31 - 1, max_bytes=2**62)
        try:
            reply = stub.Pull(huge, timeout=30)
        except grpc.RpcError as exc:
            raise AssertionError(f"the pull failed: {_typed(exc)}") from None
        grown = _hwm_bytes(pid) - before
        print(f"broker peak RSS grew by {grown >> 20} MiB")
        n = len(reply.messages)
        assert 0 < n < COUNT, f"one reply carried {n} of {COUNT} messages"
        assert reply.ByteSize() <= MAX_PULL_BYTES + BODY + (64 << 10), "the reply exceeds max_pull_bytes"
        # one reply's records, their protobuf copy and its serialisation: a few times 16 MiB, not 40 MiB each
        assert grown < 100 << 20, f"the broker grew by {grown >> 20} MiB for one pull"

        # asking for too much again and again still reads everything, in order
        got, offset = [], 0
        while offset < COUNT:
            r = stub.Pull(
                pb.PullRequest(topic=TOPIC, queue=0, offset=offset, max_messages=2**31 - 1, max_bytes=2**62),
                timeout=30,
            )
            assert r.messages and r.ByteSize() <= MAX_PULL_BYTES + BODY + (64 << 10)
            got.extend(msg.body for msg in r.messages)
            offset = r.next_offset
        assert got == bodies
    finally:
        channel.close()

    # and so does the consumer of tidelog.client
    seen: list[bytes] = []
    with (
        Client(c.controllers) as client,
        client.consumer(group="g", topic=TOPIC, start="earliest") as consumer,
    ):
        deadline = time.monotonic() + 60
        while len(seen) < COUNT and time.monotonic() < deadline:
            seen.extend(msg.body for msg in consumer.poll(max_messages=1000, timeout=1.0) if msg.queue == 0)
    assert seen == bodies


def test_a_committed_offset_beyond_the_queue_end_is_refused(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    c = broker_cluster(2)
    m = c.bs.wait_master()
    master = c.bs.clients[m]
    for i in range(3):
        master.produce(TOPIC, [b"m-%d" % i], queue=1)
    master.commit("g", TOPIC, 1, 3)  # the end of the queue is a valid position: everything consumed
    assert master.fetch("g", TOPIC, 1) == 3
    for offset in (4, 10**15):
        with pytest.raises(InvalidArgumentError) as err:
            master.commit("g", TOPIC, 1, offset)
        assert "beyond" in err.value.message and err.value.hint
    assert master.fetch("g", TOPIC, 1) == 3, "a refused commit changes nothing"
    with pytest.raises(InvalidArgumentError):
        master.commit("g", TOPIC, QUEUES - 1, 1)  # an empty queue takes only 0
    master.commit("g", TOPIC, QUEUES - 1, 0)
