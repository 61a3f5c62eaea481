"""Fork repair: a deposed master truncates exactly its unreplicated tail and then matches byte for byte.

The slave is paused (SIGSTOP) so that the master appends writes nobody acknowledges (they fail
with FLUSH_SLAVE_TIMEOUT but stay in the master's log); then the master is paused and the slave
resumed, well within `ha_max_time_slave_not_catchup_ms`, so it is still in the SyncStateSet and
gets elected. The old master, resumed, must become a slave of the new epoch, cut its log back to
where the new epoch starts, follow the new master, and end with a commit log that is
byte-identical to the new master's up to the confirm offset.

A paused receiver still gets what fits in its kernel socket buffers, so the unacknowledged tail
is made larger than those (several MiB): only then does the old master hold bytes the new
master never saw.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import (
    BrokerClient,
    BrokerSetProcs,
    commitlog_prefix,
    pause,
    read_queues,
    resume,
    status_of,
)
from tests.procs import wait_until
from tidelog.errors import FlushSlaveTimeoutError
from tidelog.proto import broker_pb2 as pb

pytestmark = pytest.mark.slow

BODY = 200 * 1024  # five records per 1 MiB segment
TAIL_REQUESTS = 4  # sent concurrently while the slave is paused ...
TAIL_BATCH = 12  # ... each carrying this many bodies: ~9.6 MiB in all


def _append_unacked_tail(
    bs: BrokerSetProcs, old: int, new: int, master: BrokerClient
) -> tuple[list[type[Exception] | None], int, float]:
    """Pause the slave, append a tail nobody acks, then pause the master and resume the slave.

    Returns each tail request's outcome, the master's max offset after the tail, and how long the
    slave was paused.
    """
    pause(bs.procs[new])
    paused_at = time.monotonic()
    try:

        def unacked(r: int) -> type[Exception] | None:
            try:
                master.produce(
                    TOPIC, [b"tail-%d-%d-" % (r, k) + b"x" * BODY for k in range(TAIL_BATCH)], timeout=10
                )
            except Exception as exc:
                return type(exc)
            return None

        with ThreadPoolExecutor(TAIL_REQUESTS) as pool:
            outcomes = list(pool.map(unacked, range(TAIL_REQUESTS)))
        tail_end = master.status().max_offset
        pause(bs.procs[old])
    finally:
        resume(bs.procs[new])
    slave_paused_s = time.monotonic() - paused_at
    return outcomes, tail_end, slave_paused_s


def _slave_elected_for_a_new_epoch(bs: BrokerSetProcs, new: int, epoch1: int) -> pb.StatusReply:
    """The slave is elected for a new epoch (its status once it is master)."""
    return wait_until(
        lambda: (
            (s := status_of(bs, new)) is not None and s.role == "master" and s.master_epoch > epoch1 and s
        ),
        15,
        what="the slave to be elected",
    )


def _old_master_repairs_and_follows(bs: BrokerSetProcs, old: int, new: int, epoch2: int) -> pb.StatusReply:
    """The old master learns it was deposed, repairs its fork and follows; the new master's final status."""
    wait_until(
        lambda: (s := status_of(bs, old)) is not None and s.role == "slave" and s.master_epoch == epoch2,
        15,
        what="the old master to become a slave",
    )
    return wait_until(
        lambda: (
            (m := status_of(bs, new)) is not None
            and (s := status_of(bs, old)) is not None
            and m.max_offset == s.max_offset
            and m.confirm_offset == m.max_offset
            and s.confirm_offset == m.max_offset
            and s.flushed_offset >= m.max_offset
            and m
        ),
        15,
        what="both replicas to hold, confirm and flush the same log",
    )


def _assert_replicas_match(
    bs: BrokerSetProcs, old: int, new: int, master: BrokerClient, slave: BrokerClient, confirm_offset: int
) -> None:
    """Byte-identical commit logs up to the confirm offset, the same messages served, none lost."""
    theirs = commitlog_prefix(bs.data_dirs[new], confirm_offset)
    mine = commitlog_prefix(bs.data_dirs[old], confirm_offset)
    assert mine == theirs, f"the commit logs differ first at offset {_first_diff(mine, theirs)}"

    on_new = read_queues(slave, TOPIC, QUEUES)
    same = read_queues(master, TOPIC, QUEUES) == on_new
    assert same, "the replicas serve different messages"
    bodies = [b for q in on_new.values() for b in q]
    assert all(b"acked-%d" % i in bodies for i in range(8)) and all(
        b"epoch2-%d" % i in bodies for i in range(5)
    )


def test_deposed_master_truncates_its_unacked_tail(broker_cluster: Callable[..., BrokerCluster]) -> None:
    # the idle timeout is raised so that only ha_max_time_slave_not_catchup_ms (4 s) bounds the pause
    bs = broker_cluster(2, slave_timeout_ms=1000, flush="sync", ha_idle_timeout_ms=6000).bs
    old = bs.wait_master()
    new = 1 - old
    master, slave = bs.clients[old], bs.clients[new]
    for i in range(8):
        master.produce(TOPIC, [b"acked-%d" % i])
    before = master.status()
    epoch1 = before.master_epoch
    wait_until(lambda: slave.status().max_offset == before.max_offset, 5, what="the slave to catch up")

    outcomes, tail_end, slave_paused_s = _append_unacked_tail(bs, old, new, master)
    try:
        assert slave_paused_s < 3.5, f"the slave was paused {slave_paused_s:.1f}s, too long for this scenario"
        assert outcomes == [FlushSlaveTimeoutError] * TAIL_REQUESTS, outcomes
        assert tail_end > before.max_offset + TAIL_REQUESTS * TAIL_BATCH * BODY, "the tail was not appended"

        # the slave is elected for a new epoch and takes writes
        promoted = _slave_elected_for_a_new_epoch(bs, new, epoch1)
        epoch2_start = promoted.max_offset
        assert before.max_offset <= epoch2_start < tail_end, (before.max_offset, epoch2_start, tail_end)
        for i in range(5):
            slave.produce(TOPIC, [b"epoch2-%d" % i])
    finally:
        resume(bs.procs[old])

    final = _old_master_repairs_and_follows(bs, old, new, promoted.master_epoch)
    assert final.max_offset < tail_end, "the old master kept bytes the new master never had"
    assert final.max_offset > epoch2_start, "the new epoch's writes are missing"

    _assert_replicas_match(bs, old, new, master, slave, final.confirm_offset)
    print(
        f"\nunacked tail [{before.max_offset}, {tail_end}); epoch {promoted.master_epoch} starts at {epoch2_start}; "
        f"old master truncated {tail_end - epoch2_start} bytes; slave paused {slave_paused_s:.2f}s"
    )


def _first_diff(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_restarted_master_does_not_confirm_its_unreplicated_tail(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    """What a reader saw on a master that restarted fast after a crash survives the next failover.

    It is back well within the controller's timeout but does not resume its epoch (its log may
    have lost a tail the slave holds): it asks for a new one, and with the slave paused it wins it
    (controller/RULES.md E8). The slave then follows it, is cut to its history, rejoins the set,
    and is elected when the restarted master dies: with what the reader saw."""
    # a long controller timeout: the master restarts well within it
    bs = broker_cluster(
        2, slave_timeout_ms=1000, flush="sync", controller_options={"heartbeat_timeout_ms": 6000}
    ).bs
    old = bs.wait_master()
    new = 1 - old
    master = bs.clients[old]
    for i in range(4):
        master.produce(TOPIC, [b"acked-%d" % i], queue=i % QUEUES)
    before = master.status()
    wait_until(
        lambda: bs.clients[new].status().max_offset == before.max_offset, 5, what="the slave to catch up"
    )

    pause(bs.procs[new])
    try:

        def unacked(r: int) -> None:
            with contextlib.suppress(FlushSlaveTimeoutError):
                master.produce(
                    TOPIC,
                    [b"tail-%d-%d-" % (r, k) + b"x" * BODY for k in range(TAIL_BATCH)],
                    queue=r % QUEUES,
                    timeout=10,
                )

        with ThreadPoolExecutor(TAIL_REQUESTS) as pool:
            list(pool.map(unacked, range(TAIL_REQUESTS)))
        bs.procs[old].kill9()
        bs.procs[old].start()
        again = wait_until(
            lambda: (s := status_of(bs, old)) is not None and s.role == "master" and s,
            25,
            what="the restarted broker to be master again",
        )
        assert again.master_epoch > before.master_epoch, "a master back from a crash resumed its epoch"
        seen = read_queues(master, TOPIC, QUEUES)  # what a consumer reads from the restarted master now
    finally:
        resume(bs.procs[new])
    bs.wait_in_sync(2, timeout=30)  # the slave follows the new epoch and is proposed back in
    bs.procs[old].kill9()

    wait_until(
        lambda: (s := status_of(bs, new)) is not None and s.role == "master",
        15,
        what="the slave to be elected",
    )
    after = read_queues(bs.clients[new], TOPIC, QUEUES)
    for q in range(QUEUES):
        kept = after[q][: len(seen[q])] == seen[q]
        assert kept, (
            f"queue {q}: {len(seen[q]) - len(after[q])} messages a reader saw on the restarted master "
            "are gone after the failover"
        )
