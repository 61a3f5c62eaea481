"""Bad input to a broker gets a typed error and the broker keeps serving.

- gRPC: malformed or invalid requests answer INVALID_ARGUMENT / TOPIC_NOT_FOUND / NOT_MASTER /
  MESSAGE_ILLEGAL, and a good request succeeds afterwards;
- HA port: garbage, a truncated frame, a frame of the wrong type, an ack beyond the log close
  that connection only: the process lives, the real slave stays in sync and a replicated write
  still succeeds;
- a broker whose data directory was wiped comes back under a new broker id.
"""

from __future__ import annotations

import shutil
import socket
import struct
import time
from collections.abc import Callable

import grpc
import pytest

from tests.broker.conftest import QUEUES, SET, TOPIC, BrokerCluster
from tests.brokers import BrokerClient, BrokerSetProcs, read_queues, status_of
from tests.procs import wait_until
from tidelog.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotMasterError,
    TidelogError,
    TopicNotFoundError,
)
from tidelog.ha.protocol import Ack, Handshake, encode
from tidelog.proto import broker_pb2 as pb

pytestmark = pytest.mark.slow


def _replicated_write_ok(bs: BrokerSetProcs, master: int, body: bytes) -> None:
    """A write that needs the slave's ack (the SyncStateSet has both replicas) succeeds."""
    assert len(bs.clients[master].status().sync_state_set) == 2
    r = bs.clients[master].produce(TOPIC, [body], timeout=10).results[0]
    slave = 1 - master
    wait_until(
        lambda: any(m.body == body for m in bs.clients[slave].pull(TOPIC, r.queue, r.queue_offset).messages),
        5,
        what="the write to be readable on the slave",
    )


Case = tuple[str, type[TidelogError], Callable[[], object]]


def _bad_request_cases(bs: BrokerSetProcs, m: int) -> list[Case]:
    """Every invalid request, named, with the typed error it must get (master `m`, slave 1 - m)."""
    c: BrokerClient = bs.clients[m]
    return [
        ("produce, empty topic", InvalidArgumentError, lambda: c.produce("", [b"x"])),
        ("produce, unknown topic", TopicNotFoundError, lambda: c.produce("no-such-topic", [b"x"])),
        ("produce, reserved topic", InvalidArgumentError, lambda: c.produce("%OFFSETS%", [b"x"])),
        ("produce, no messages", InvalidArgumentError, lambda: c.produce(TOPIC, [])),
        ("produce, negative queue", InvalidArgumentError, lambda: c.produce(TOPIC, [b"x"], queue=-1)),
        ("produce, queue out of range", InvalidArgumentError, lambda: c.produce(TOPIC, [b"x"], queue=QUEUES)),
        ("produce, too large", MessageTooLargeError, lambda: c.produce(TOPIC, [b"x" * (2 << 20)])),
        ("pull, empty topic", InvalidArgumentError, lambda: c.pull("", 0, 0)),
        ("pull, unknown topic", TopicNotFoundError, lambda: c.pull("no-such-topic", 0, 0)),
        ("pull, negative queue", InvalidArgumentError, lambda: c.pull(TOPIC, -1, 0)),
        ("pull, queue out of range", InvalidArgumentError, lambda: c.pull(TOPIC, QUEUES, 0)),
        ("pull, negative offset", InvalidArgumentError, lambda: c.pull(TOPIC, 0, -5)),
        (
            "pull, negative limit",
            InvalidArgumentError,
            lambda: c._call("Pull", pb.PullRequest(topic=TOPIC, queue=0, offset=0, max_messages=-1)),
        ),
        (
            "pull, wait too long",
            InvalidArgumentError,
            lambda: c._call("Pull", pb.PullRequest(topic=TOPIC, queue=0, offset=0, wait_ms=10**9)),
        ),
        ("offsets, queue out of range", InvalidArgumentError, lambda: c.offsets(TOPIC, QUEUES)),
        ("offsets, unknown topic", TopicNotFoundError, lambda: c.offsets("no-such-topic", 0)),
        ("commit, empty group", InvalidArgumentError, lambda: c.commit("", TOPIC, 0, 1)),
        ("commit, group too long", InvalidArgumentError, lambda: c.commit("g" * 300, TOPIC, 0, 1)),
        (
            "produce, reserved property",
            InvalidArgumentError,
            lambda: c._call(
                "Produce",
                pb.ProduceRequest(
                    topic=TOPIC, messages=[pb.ProduceMessage(body=b"x", properties={"KEYS": "k"})]
                ),
            ),
        ),
        (
            "produce, properties too large",
            MessageTooLargeError,
            lambda: c._call(
                "Produce",
                pb.ProduceRequest(
                    topic=TOPIC, messages=[pb.ProduceMessage(body=b"x", properties={"p": "v" * 40_000})]
                ),
            ),
        ),
        ("commit, negative offset", InvalidArgumentError, lambda: c.commit("g", TOPIC, 0, -1)),
        ("commit, queue out of range", InvalidArgumentError, lambda: c.commit("g", TOPIC, QUEUES, 1)),
        ("commit, unknown topic", TopicNotFoundError, lambda: c.commit("g", "no-such-topic", 0, 1)),
        ("fetch, empty group", InvalidArgumentError, lambda: c.fetch("", TOPIC, 0)),
        ("produce to the slave", NotMasterError, lambda: bs.clients[1 - m].produce(TOPIC, [b"x"])),
        ("commit on the slave", NotMasterError, lambda: bs.clients[1 - m].commit("g", TOPIC, 0, 1)),
    ]


def _assert_each_case_refused(c: BrokerClient, cases: list[Case]) -> None:
    """Each case raises exactly its typed error and appends nothing."""
    before = c.status().max_offset
    wrong = []
    for name, expected, call in cases:
        try:
            call()
            wrong.append(f"{name}: succeeded")
        except Exception as exc:
            if type(exc) is not expected:
                wrong.append(f"{name}: {exc!r}, expected {expected.__name__}")
    assert not wrong, "\n".join(wrong)
    assert c.status().max_offset == before, "a refused request appended something"


def _assert_not_master_names_the_master(bs: BrokerSetProcs, m: int) -> None:
    """NOT_MASTER names the master, so a client can redirect without a route refresh."""
    with pytest.raises(grpc.RpcError) as info:
        bs.clients[1 - m].stub.Produce(
            pb.ProduceRequest(topic=TOPIC, messages=[pb.ProduceMessage(body=b"x")]), timeout=5
        )
    md = dict(info.value.trailing_metadata() or ())
    assert md.get("tidelog-error-code") == "NOT_MASTER", md
    assert md.get("tidelog-leader") == bs.addresses[m], md


def test_invalid_requests_get_typed_errors(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2).bs
    m = bs.wait_master()
    c: BrokerClient = bs.clients[m]
    cases = _bad_request_cases(bs, m)
    _assert_each_case_refused(c, cases)
    assert all(p.alive() for p in bs.procs)
    r = c.produce(TOPIC, [b"good"], queue=1).results[0]
    assert [x.body for x in c.pull(TOPIC, 1, r.queue_offset).messages] == [b"good"]
    _assert_not_master_names_the_master(bs, m)


def _ha_address(bs: BrokerSetProcs, i: int) -> tuple[str, int]:
    import yaml

    doc = yaml.safe_load((bs.root / f"{bs.name}-{i}.yaml").read_text())
    host, _, port = doc["ha_listen"].rpartition(":")
    return host, int(port)


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Read until EOF (True) or `timeout` (False); whatever the master says first is skipped."""
    sock.settimeout(timeout)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_ha_port_survives_garbage(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2, ha_idle_timeout_ms=3000).bs
    m = bs.wait_master()
    ha = _ha_address(bs, m)
    _replicated_write_ok(bs, m, b"before")
    max_offset = bs.clients[m].status().max_offset
    streams = {
        "garbage": b"\xde\xad\xbe\xef" * 64,
        "zero length": struct.pack(">I", 0) + b"\x01",
        "unknown frame type": struct.pack(">IB", 9, 77) + b"\x00" * 8,
        "ack first": encode(Ack(0)),
        "handshake cut short": encode(Handshake(SET, 999, 0, ()))[:9],
        "handshake of another set": encode(Handshake("broker-zz", 999, 0, ())),
        "ack beyond the log": encode(Handshake(SET, 999, 0, ()))
        + encode(Ack(0))
        + encode(Ack(max_offset + 10**6)),
    }
    results = {}
    for name, data in streams.items():
        with socket.create_connection(ha, timeout=5) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)  # the truncated frame never completes
            results[name] = _closed_by_peer(s, 5)
        assert bs.procs[m].alive(), f"the master died on {name!r}"
    # a frame that stops in the middle, with the connection left open: closed by the idle timeout
    with socket.create_connection(ha, timeout=5) as s:
        s.sendall(struct.pack(">I", 1000) + b"\x01\x00")
        results["stalled frame"] = _closed_by_peer(s, 3 + 3)
    assert results == dict.fromkeys(results, True), f"connections left open: {results}"

    assert all(p.alive() for p in bs.procs)
    assert bs.master_index() == m
    ids = {bs.clients[i].status().broker_id for i in range(2)}
    assert set(bs.clients[m].status().sync_state_set) == ids, "a bogus slave changed the SyncStateSet"
    _replicated_write_ok(bs, m, b"after")


def test_wiped_replica_registers_under_a_new_id(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2).bs
    m = bs.wait_master()
    s = 1 - m
    for i in range(6):
        bs.clients[m].produce(TOPIC, [b"kept-%d" % i])
    old_id = bs.clients[s].status().broker_id
    master_id = bs.clients[m].status().broker_id

    bs.procs[s].stop()
    shutil.rmtree(bs.data_dirs[s])
    bs.procs[s].start()
    fresh = wait_until(
        lambda: (st := status_of(bs, s)) is not None and st.broker_id > 0 and st,
        15,
        what="the wiped replica to register",
    )
    assert fresh.broker_id not in (old_id, master_id), f"the wiped replica came back as {fresh.broker_id}"

    # it copies the whole log from the master and joins the SyncStateSet under its new id
    wait_until(
        lambda: set(bs.clients[m].status().sync_state_set) == {master_id, fresh.broker_id},
        20,
        what="the new replica to join the SyncStateSet",
    )
    _replicated_write_ok(bs, m, b"after-wipe")
    end = bs.clients[m].status().max_offset
    wait_until(
        lambda: (st := status_of(bs, s)) is not None and st.confirm_offset == end,
        10,
        what="the new replica to confirm the log",
    )
    assert read_queues(bs.clients[s], TOPIC, QUEUES) == read_queues(bs.clients[m], TOPIC, QUEUES)
    assert bs.clients[s].status().broker_id == fresh.broker_id


def test_oversized_property_name_gets_a_typed_error(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(1).bs
    c = bs.clients[bs.wait_master()]
    before = c.status().max_offset
    msg = pb.ProduceMessage(body=b"x", properties={"n" * 70_000: "v"})
    with pytest.raises((MessageTooLargeError, InvalidArgumentError)):
        c._call("Produce", pb.ProduceRequest(topic=TOPIC, messages=[msg]))
    assert c.status().max_offset == before
    c.produce(TOPIC, [b"good"])
