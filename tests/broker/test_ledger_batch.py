"""The broker's `Ledger.AddBatch` over real processes, raw gRPC (no ledger client in between).

A batch is checked as a whole before anything is written (docs/ARCHITECTURE.md §8.2): bad input
answers a typed error and leaves the ledger exactly as it was, still writable; a good batch is
one run of records that both replicas hold; a retried batch is answered, not stored twice;
batches that arrive out of order are sequenced; a fenced ledger fails the whole batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.broker.test_ledger_wire import PASSWORD, LedgerWire, _setup
from tidelog.errors import (
    DigestMatchError,
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    UnauthorizedAccessError,
)
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import DigestType
from tidelog.proto import ledger_pb2 as lpb

pytestmark = pytest.mark.slow

LEDGER = 7  # the ledger `_setup` creates


def batch(first: int, datas: Sequence[bytes], *, length: int) -> list[lpb.Entry]:
    """Entries `first`, `first + 1`, … with the data given; `length` is the ledger's length before
    `first`; each entry carries the LAC `entry_id - 1` (the writer's, all earlier ones acked)."""
    digester = Digester(DigestType.CRC32C)
    out = []
    for i, data in enumerate(datas):
        e = first + i
        length += len(data)
        digest = digester.compute(LEDGER, e, e - 1, length, data)
        out.append(lpb.Entry(entry_id=e, lac=e - 1, length=length, digest=digest, data=data))
    return out


def add_batch(w: LedgerWire, entries: Sequence[lpb.Entry], *, password: bytes = PASSWORD) -> Any:
    req = lpb.AddBatchRequest(ledger_id=LEDGER, password=password, entries=list(entries))
    return w.call("AddBatch", req, timeout=20)


def read_all(w: LedgerWire, last: int) -> list[bytes]:
    got = w.call("Read", lpb.ReadRequest(ledger_id=LEDGER, password=PASSWORD, first=0, last=last))
    return [e.data for e in got.entries]


def lac(w: LedgerWire) -> lpb.LacReply:
    return w.call("Lac", lpb.LacRequest(ledger_id=LEDGER, password=PASSWORD, previous=-1))


def test_bad_batches_change_nothing_and_good_ones_are_one_run(broker_cluster: Callable[..., Any]) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    first = batch(0, [b"a%d" % i for i in range(10)], length=0)
    length = first[-1].length
    reply = add_batch(master, first)
    assert (reply.first_entry_id, reply.last_entry_id, len(reply.replicas)) == (0, 9, 2)
    assert read_all(slave, 9) == [b"a%d" % i for i in range(10)]

    nxt = batch(10, [b"b%d" % i for i in range(5)], length=length)
    gap = [*nxt[:2], *nxt[3:]]
    wrong_digest = [
        *nxt[:4],
        lpb.Entry(entry_id=14, lac=13, length=nxt[4].length, digest=b"\0" * 4, data=b"x"),
    ]
    too_many = batch(10, [b""] * 10_001, length=length)
    too_big = batch(10, [b"x" * (5 << 20)], length=length)
    below = batch(5, [b"again"], length=0)
    bad: list[tuple[list[lpb.Entry], type[Exception], bytes]] = [
        ([], IncorrectParameterError, PASSWORD),  # empty
        (gap, IncorrectParameterError, PASSWORD),  # ids not contiguous
        (too_many, IncorrectParameterError, PASSWORD),  # oversize: entries
        (too_big, IncorrectParameterError, PASSWORD),  # oversize: bytes
        (below, IncorrectParameterError, PASSWORD),  # other data at a held id
        (wrong_digest, DigestMatchError, PASSWORD),
        (nxt, UnauthorizedAccessError, b"wrong"),
    ]
    for entries, error, password in bad:
        with pytest.raises(error):
            add_batch(master, entries, password=password)
    # nothing of those was written, nothing was closed or fenced: the next good batch goes through
    for w in (master, slave):
        with pytest.raises(NoSuchEntryError):
            w.call("Read", lpb.ReadRequest(ledger_id=LEDGER, password=PASSWORD, first=10, last=10))
    assert lac(master).lac == 9 and not lac(master).fenced
    reply = add_batch(master, nxt)
    assert (reply.first_entry_id, reply.last_entry_id) == (10, 14)
    # a retried batch (its outcome unknown to the writer) is answered and not stored twice,
    # also when it overlaps what is held and carries new entries after it
    overlap = nxt[3:] + batch(15, [b"c0"], length=nxt[-1].length)
    assert add_batch(master, nxt).last_entry_id == 14
    assert add_batch(master, overlap).last_entry_id == 15
    expected = [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(5)] + [b"c0"]
    for w in (master, slave):
        assert read_all(w, 15) == expected
    assert (lac(master).lac, lac(master).length) == (15, overlap[-1].length)


def test_out_of_order_batches_are_sequenced_and_a_fence_fails_the_batch(
    broker_cluster: Callable[..., Any],
) -> None:
    c, master, slave, m, s = _setup(broker_cluster)
    runs = [batch(0, [b"p0", b"p1"], length=0)]
    runs.append(batch(2, [b"p2", b"p3", b"p4"], length=runs[-1][-1].length))
    runs.append(batch(5, [b"p5"], length=runs[-1][-1].length))
    results: dict[int, Any] = {}

    def send(i: int) -> None:
        results[i] = add_batch(master, runs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in (2, 1, 0)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # the later batches arrive first and wait for the ids before them
    for t in threads:
        t.join(20)
    assert sorted(results) == [0, 1, 2]
    assert read_all(slave, 5) == [b"p%d" % i for i in range(6)]

    slave.call("Fence", lpb.FenceRequest(ledger_id=LEDGER, password=PASSWORD))
    later = batch(6, [b"p6", b"p7"], length=runs[-1][-1].length)
    deadline = time.monotonic() + 5
    while True:  # the slave tells the master of its fence; from then on batches fail whole
        try:
            add_batch(master, later)
        except LedgerFencedError:
            break
        assert time.monotonic() < deadline, "the master kept acknowledging batches of a fenced ledger"
        later = batch(later[-1].entry_id + 1, [b"q"], length=later[-1].length)
    got = slave.call(
        "Read", lpb.ReadRequest(ledger_id=LEDGER, password=PASSWORD, first=0, last=100, fence=True)
    ).entries
    assert [e.data for e in got][:6] == [b"p%d" % i for i in range(6)]
    assert len(got) == 6, "an add that reached the slave after its fence is not an entry there"
