"""A damaged replica that is the only choice is elected, never serves its damaged bytes, and
repairs them from the first replica to return that holds them (docs/SECURITY.md, probe 11;
docs/ARCHITECTURE.md §3.9).

Real processes: a controller and a broker set of two. With every message on both replicas, the
master is stopped and a byte is flipped in one message of the slave's first segment: the slave,
alone, is elected. Its reads answer every other message and, for the damaged one, CORRUPT_RECORD
naming the damaged range (never the bytes). The stopped replica then returns as its slave: the
master asks it for its copy of the range and rewrites it, and serves every message, staying
master (before, it answered a bare CORRUPT_RECORD, and handed its role over to the returning
replica once that was in sync, to repair as a slave)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster, broker_cluster  # noqa: F401 (a fixture)
from tests.brokers import BrokerClient, status_of
from tests.procs import wait_until
from tidelog.errors import CorruptRecordError

pytestmark = pytest.mark.slow

N = 200
RANGE = re.compile(r"bytes \[(\d+), (\d+)\) of broker \d+'s log are damaged")


def _read_all(client: BrokerClient) -> tuple[list[bytes], list[CorruptRecordError]]:
    """Every message of the topic read one at a time: (the bodies served, the refusals met)."""
    bodies: list[bytes] = []
    refused: list[CorruptRecordError] = []
    for q in range(QUEUES):
        end = client.offsets(TOPIC, q).max
        for offset in range(end):
            try:
                reply = client.pull(TOPIC, q, offset, max_messages=1)
            except CorruptRecordError as exc:
                refused.append(exc)
                continue
            bodies.extend(m.body for m in reply.messages)
    return bodies, refused


def test_the_only_replica_left_serves_no_damaged_bytes_and_repairs_from_a_returning_one(
    broker_cluster: Callable[..., BrokerCluster],  # noqa: F811
) -> None:
    bs = broker_cluster(2, scrub_bytes_per_s=64 << 20).bs
    master = bs.wait_in_sync(2)
    sent: list[bytes] = []
    phys: list[int] = []
    for start in range(0, N, 50):
        batch = [b"m-%05d-" % i + b"z" * 1000 for i in range(start, start + 50)]
        reply = bs.clients[master].produce(TOPIC, batch)
        sent.extend(batch)
        phys.extend(r.phys_offset for r in reply.results)
    end = bs.clients[master].status().max_offset
    damaged, healthy = 1 - master, master
    wait_until(
        lambda: (
            (s := status_of(bs, damaged)) is not None and s.confirm_offset == end and s.flushed_offset == end
        ),
        15,
        what="the slave to hold, flush and confirm every message",
    )
    at = phys[N // 2] + 100  # inside one message's record, in the first segment
    victim = sorted((bs.data_dirs[damaged] / "commitlog").iterdir())[0]
    assert victim.stat().st_size > at
    good = victim.read_bytes()[at - 2048 : at + 2048]

    bs.procs[healthy].stop()  # the only copy left is the one about to be damaged
    with open(victim, "r+b") as f:  # under the running broker: its reads see the page cache
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert bs.wait_master(timeout=30) == damaged
    epoch = bs.clients[damaged].status().master_epoch
    log_path = bs.procs[damaged].log_path
    wait_until(
        lambda: "no connected replica holds them" in log_path.read_text(errors="replace"),
        15,
        what="the new master to find the damage and say that no replica can repair it",
    )

    bodies, refused = _read_all(bs.clients[damaged])
    assert set(bodies) <= set(sent), "a damaged body was served"
    assert len(bodies) == N - 1 and len(refused) == 1, (len(bodies), [e.message for e in refused])
    named = RANGE.search(refused[0].message)
    assert named is not None, refused[0].message
    assert int(named[1]) <= at < int(named[2]), (at, refused[0].message)
    assert "no connected replica holds a copy" in refused[0].message

    bs.procs[healthy].start()  # it returns as the slave, holding the range
    wait_until(
        lambda: victim.read_bytes()[at - 2048 : at + 2048] == good,
        30,
        what="the master to repair the range from the returning replica's copy",
    )
    s = bs.clients[damaged].status()
    assert (s.role, s.master_epoch) == ("master", epoch), "it gave its role up instead of repairing"
    assert "of the master's log from slave" in log_path.read_text(errors="replace")
    bodies, refused = _read_all(bs.clients[damaged])
    assert not refused and sorted(bodies) == sorted(sent)
    wait_until(
        lambda: "is whole again" in log_path.read_text(errors="replace"),
        15,
        what="the repaired master's scrub to find the range whole",
    )
