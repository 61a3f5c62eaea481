"""auto_in_sync_replicas: the ack need follows the SyncStateSet down to min_in_sync_replicas, then refuses.

Three replicas with in_sync_replicas 3, min_in_sync_replicas 2: with one slave dead (and the set
shrunk to two) writes still succeed; with both slaves dead (the set is the master alone) a sync
write is refused before anything is appended (IN_SYNC_REPLICAS_NOT_ENOUGH, max offset
unchanged); a restarted slave catches up, rejoins, and writes succeed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import BrokerSetProcs, pause, read_queues, resume, status_of
from tests.procs import wait_until
from tidelog.errors import (
    FlushSlaveTimeoutError,
    InSyncReplicasNotEnoughError,
    NotMasterError,
    SlaveNotAvailableError,
)

pytestmark = pytest.mark.slow

SLAVE_TIMEOUT_MS = 3000  # the harness default


def _sss(bs: BrokerSetProcs, master: int) -> list[int]:
    s = status_of(bs, master)
    return list(s.sync_state_set) if s is not None else []


def _pending(bs: BrokerSetProcs, master: int) -> list[int]:
    s = status_of(bs, master)
    return list(s.pending_sync_state_set) if s is not None else []


def test_acks_shrink_with_the_set_then_refuse(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(
        3, in_sync_replicas=3, min_in_sync_replicas=2, auto_in_sync_replicas=True, flush="sync"
    ).bs
    m = bs.wait_master()
    client = bs.clients[m]
    ids = {i: bs.clients[i].status().broker_id for i in range(3)}
    a, b = [i for i in range(3) if i != m]
    acked: list[tuple[bytes, int, int]] = []  # body, queue, queue offset

    def produce(body: bytes) -> None:
        r = client.produce(TOPIC, [body]).results[0]
        acked.append((body, r.queue, r.queue_offset))

    for i in range(5):
        produce(b"all-three-%d" % i)

    # one slave dead: once the set has shrunk to two, each write needs (and gets) two acks
    bs.procs[a].kill9()
    wait_until(
        lambda: sorted(_sss(bs, m)) == sorted([ids[m], ids[b]]),
        15,
        what="the SyncStateSet to drop the dead slave",
    )
    for i in range(5):
        produce(b"two-%d" % i)

    # both slaves dead: the set is the master alone, below the minimum: refuse before appending
    bs.procs[b].kill9()
    wait_until(lambda: _sss(bs, m) == [ids[m]], 15, what="the SyncStateSet to shrink to the master")
    for i in range(3):
        before = client.status().max_offset
        t0 = time.monotonic()
        with pytest.raises(InSyncReplicasNotEnoughError):
            client.produce(TOPIC, [b"refused-%d" % i])
        took = time.monotonic() - t0
        assert client.status().max_offset == before, "a refused write was appended"
        assert took < SLAVE_TIMEOUT_MS / 1000, f"the refusal waited {took:.1f}s, like a slave timeout"

    # a slave comes back, catches up and rejoins; writes succeed again
    bs.procs[b].start()
    wait_until(
        lambda: sorted(_sss(bs, m)) == sorted([ids[m], ids[b]]),
        20,
        what="the restarted slave to rejoin the SyncStateSet",
    )
    for i in range(5):
        produce(b"rejoined-%d" % i)
    assert bs.master_index() == m

    end = client.status().max_offset
    wait_until(
        lambda: (s := status_of(bs, b)) is not None and s.max_offset == end and s.confirm_offset == end,
        10,
        what="the rejoined slave to hold and confirm everything",
    )
    on_master = read_queues(client, TOPIC, QUEUES)
    assert read_queues(bs.clients[b], TOPIC, QUEUES) == on_master
    stored = [x for q in on_master.values() for x in q]
    for body, q, offset in acked:
        assert on_master[q][offset] == body, f"acked {body!r} is not at queue {q} offset {offset}"
    assert not [x for x in stored if x.startswith(b"refused-")], "a refused write is readable"
    assert sorted(x for x in stored if not x.startswith(b"all-three")) == sorted(
        [b"two-%d" % i for i in range(5)] + [b"rejoined-%d" % i for i in range(5)]
    )


def test_ack_from_a_pending_member_survives_failover(broker_cluster: Callable[..., BrokerCluster]) -> None:
    """Only controller-confirmed SyncStateSet members may make a write acknowledged."""
    cluster = broker_cluster(3, flush="sync")
    bs = cluster.bs
    a = bs.wait_master()
    b, c = [i for i in range(3) if i != a]
    ids = {i: bs.clients[i].status().broker_id for i in range(3)}
    for i in range(QUEUES):
        bs.clients[a].produce(TOPIC, [b"before-%d" % i], queue=i)
    controller = cluster.cc.procs[cluster.cc.ids[0]]

    # c drops out of the set (the controller applies it), then the controller stops answering
    pause(bs.procs[c])
    try:
        wait_until(
            lambda: sorted(_sss(bs, a)) == sorted([ids[a], ids[b]]),
            15,
            what="the SyncStateSet to drop the paused slave",
        )
        pause(controller)
    finally:
        resume(bs.procs[c])
    try:
        # c catches up and the master proposes it back; the proposal can get no answer: it is pending
        wait_until(lambda: len(_pending(bs, a)) == 3, 10, 0.02, what="the master to propose the slave back")
        bs.procs[b].kill9()  # the only other member the controller knows of never sees the write
        try:
            bs.clients[a].produce(TOPIC, [b"acked"], queue=0, timeout=10)
        except (FlushSlaveTimeoutError, InSyncReplicasNotEnoughError, SlaveNotAvailableError, NotMasterError):
            return  # refused (the lease also refuses: the controller is not answering): nothing was promised
        bs.procs[a].kill9()
        bs.procs[b].start()
    finally:
        controller.kill9()  # its queued requests die with it; it restarts from its Raft log
        controller.start()

    # the controller's SyncStateSet is {a, b}: b is the only member that can be elected
    wait_until(lambda: (s := status_of(bs, b)) is not None and s.role == "master", 20, what="b to be elected")
    end = bs.clients[b].status().max_offset
    wait_until(
        lambda: (s := status_of(bs, c)) is not None and s.role == "slave" and s.max_offset == end,
        15,
        what="c to follow the new master",
    )
    assert b"acked" in read_queues(bs.clients[b], TOPIC, QUEUES)[0], "an acknowledged write was lost"
