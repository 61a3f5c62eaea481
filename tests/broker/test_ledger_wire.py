"""The broker's Ledger service over real processes, raw gRPC (no ledger client in between).

These pin the per-replica answers that recovery's safety rests on (ledger/RULES.md R2, R5, R6,
W2): a fenced slave makes the master refuse and fail the writer's adds; a replica answers
no-such-entry only for an entry it knows it never had; a wrong password changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.brokers import _typed
from tidelog.errors import (
    IncorrectParameterError,
    LedgerFencedError,
    LedgerReadError,
    NoSuchEntryError,
    NotMasterError,
    UnauthorizedAccessError,
)
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import DigestType, new_ledger_metadata
from tidelog.proto import ledger_pb2 as lpb
from tidelog.proto import ledger_pb2_grpc as lpb_grpc

pytestmark = pytest.mark.slow

PASSWORD = b"secret"


class LedgerWire:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = lpb_grpc.LedgerStub(self.channel)

    def call(self, method: str, request: Any, timeout: float = 10.0) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise _typed(exc) from None


def _add(
    w: LedgerWire,
    ledger_id: int,
    entry_id: int,
    data: bytes,
    *,
    lac: int,
    length: int,
    recovery: bool = False,
    password: bytes = PASSWORD,
    timeout: float = 10.0,
) -> Any:
    digest = Digester(DigestType.CRC32C).compute(ledger_id, entry_id, lac, length, data)
    return w.call(
        "Add",
        lpb.AddRequest(
            ledger_id=ledger_id,
            entry_id=entry_id,
            password=password,
            lac=lac,
            length=length,
            digest=digest,
            data=data,
            recovery=recovery,
        ),
        timeout=timeout,
    )


def _setup(
    broker_cluster: Callable[..., Any], ack_quorum: int = 2
) -> tuple[Any, LedgerWire, LedgerWire, int, int]:
    c = broker_cluster(2)
    m = c.bs.wait_in_sync(2)
    s = 1 - m
    status = [c.bs.clients[i].status() for i in (0, 1)]
    ids = sorted(st.broker_id for st in status)
    meta = new_ledger_metadata(7, "broker-a", ids, ack_quorum, password=PASSWORD)
    master, slave = LedgerWire(c.bs.addresses[m]), LedgerWire(c.bs.addresses[s])
    master.call("Create", lpb.CreateRequest(ledger_id=7, metadata=meta.encode()))
    return c, master, slave, m, s


def test_adds_reads_and_lac_on_both_replicas(broker_cluster: Callable[..., Any]) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    length = 0
    for e in range(5):
        data = b"entry-%d" % e * (e + 1)
        length += len(data)
        reply = _add(master, 7, e, data, lac=e - 1, length=length)
        assert len(reply.replicas) == 2
    lac = master.call("Lac", lpb.LacRequest(ledger_id=7, password=PASSWORD, previous=-1))
    assert (lac.lac, lac.length) == (4, length)  # the master's LAC is exact
    # the slave vouches for what the entries it holds carry (one behind, as BookKeeper)
    assert slave.call("Lac", lpb.LacRequest(ledger_id=7, password=PASSWORD, previous=-1)).lac == 3
    for w in (master, slave):
        got = w.call("Read", lpb.ReadRequest(ledger_id=7, password=PASSWORD, first=0, last=4)).entries
        assert [x.data for x in got] == [b"entry-%d" % e * (e + 1) for e in range(5)]
        with pytest.raises(NoSuchEntryError):
            w.call("Read", lpb.ReadRequest(ledger_id=7, password=PASSWORD, first=5, last=5))
    # a retried add with the same digest is answered, not stored twice
    _add(master, 7, 4, b"entry-4" * 5, lac=3, length=length)
    with pytest.raises(IncorrectParameterError):
        master.call(
            "Add",
            lpb.AddRequest(
                ledger_id=7,
                entry_id=4,
                password=PASSWORD,
                lac=3,
                length=length,
                digest=Digester(DigestType.CRC32C).compute(7, 4, 3, length, b"x"),
                data=b"x",
            ),
        )
    with pytest.raises(NotMasterError):
        _add(slave, 7, 5, b"x", lac=4, length=length + 1)


def test_out_of_order_pipelined_adds_are_sequenced(broker_cluster: Callable[..., Any]) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    results: dict[int, Any] = {}

    def send(e: int) -> None:
        results[e] = _add(master, 7, e, b"p%d" % e, lac=e - 1, length=2 * (e + 1))

    threads = [threading.Thread(target=send, args=(e,)) for e in (3, 1, 2, 0)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # entries 3, 1, 2 arrive before 0
    for t in threads:
        t.join(15)
    assert sorted(results) == [0, 1, 2, 3]
    got = slave.call("Read", lpb.ReadRequest(ledger_id=7, password=PASSWORD, first=0, last=3)).entries
    assert [x.data for x in got] == [b"p0", b"p1", b"p2", b"p3"]


def test_fence_on_slave_fails_writer_and_hides_later_adds(broker_cluster: Callable[..., Any]) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    _add(master, 7, 0, b"zero", lac=-1, length=4)
    _add(master, 7, 1, b"one", lac=0, length=7)
    # wrong password: refused, and nothing is fenced
    with pytest.raises(UnauthorizedAccessError):
        slave.call("Fence", lpb.FenceRequest(ledger_id=7, password=b"wrong"))
    assert not slave.call("Lac", lpb.LacRequest(ledger_id=7, password=PASSWORD)).fenced
    _add(master, 7, 2, b"two", lac=1, length=10)
    reply = slave.call("Fence", lpb.FenceRequest(ledger_id=7, password=PASSWORD))
    assert reply.lac == 1 and reply.length == 7  # entry 2 carries LAC 1
    # the slave told the master, which now refuses the writer
    deadline = time.monotonic() + 5
    while True:
        try:
            _add(master, 7, 3, b"three", lac=2, length=15, timeout=5)
        except LedgerFencedError:
            break
        assert time.monotonic() < deadline, "the master kept acknowledging adds of a ledger fenced on a slave"
    assert master.call("Lac", lpb.LacRequest(ledger_id=7, password=PASSWORD)).fenced
    # a recovery add is still accepted, and reaches the fenced slave as an entry
    rep = _add(master, 7, 3, b"three", lac=2, length=15, recovery=True)
    assert len(rep.replicas) == 2
    got = slave.call(
        "Read", lpb.ReadRequest(ledger_id=7, password=PASSWORD, first=0, last=3, fence=True)
    ).entries
    assert [x.data for x in got] == [b"zero", b"one", b"two", b"three"]


def test_replica_without_the_ledger_cannot_vouch(broker_cluster: Callable[..., Any]) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    for w in (master, slave):
        with pytest.raises(LedgerReadError):  # never "no such entry": it does not know the ledger
            w.call("Read", lpb.ReadRequest(ledger_id=99, password=PASSWORD, first=0, last=0, fence=True))
        with pytest.raises(LedgerReadError):
            w.call("Fence", lpb.FenceRequest(ledger_id=99, password=PASSWORD))
    with pytest.raises(IncorrectParameterError):
        master.call("Read", lpb.ReadRequest(ledger_id=7, password=PASSWORD, first=3, last=1))
    with pytest.raises(IncorrectParameterError):
        _add(master, 7, 0, b"x" * (5 << 20), lac=-1, length=5 << 20, timeout=20)
