"""A paused master that wakes up after a failover must not acknowledge a write, and must step down.

SIGSTOP the master; the controller elects the slave; writes go to the new master; then the old
master resumes with a produce already queued on its socket (so it is served before any heartbeat
reply can tell it the news). That produce, and one sent right after, must fail with NOT_MASTER,
FLUSH_SLAVE_TIMEOUT or IN_SYNC_REPLICAS_NOT_ENOUGH, never succeed; the old master must then report
role slave, follow the new master and end with the same log.

The second scenario pauses the master together with one slave while another slave is elected,
then keeps the controller unreachable (paused) while both resume: they can still talk to each
other, as in a partition that cuts them off from the controller. A write the deposed master
acknowledges then must survive the failover.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import BrokerClient, pause, read_queues, resume, status_of
from tests.procs import wait_until
from tidelog.errors import FlushSlaveTimeoutError, InSyncReplicasNotEnoughError, NotMasterError

pytestmark = pytest.mark.slow

REFUSALS = (NotMasterError, FlushSlaveTimeoutError, InSyncReplicasNotEnoughError)


def test_resumed_master_refuses_writes_and_follows(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2, flush="sync").bs
    old = bs.wait_master()
    new = 1 - old
    for i in range(5):
        bs.clients[old].produce(TOPIC, [b"before-%d" % i])
    epoch1 = bs.clients[old].status().master_epoch

    def produce_to_old(body: bytes) -> BaseException | None:
        try:
            bs.clients[old].produce(TOPIC, [body], timeout=15)
        except Exception as exc:
            return exc
        return None

    pause(bs.procs[old])
    try:
        promoted = wait_until(
            lambda: (
                (s := status_of(bs, new)) is not None and s.role == "master" and s.master_epoch > epoch1 and s
            ),
            15,
            what="the slave to be elected",
        )
        for i in range(5):
            bs.clients[new].produce(TOPIC, [b"after-%d" % i])
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(produce_to_old, b"stale-queued")
            time.sleep(0.3)  # the request waits in the paused process's socket
            resume(bs.procs[old])
            right_after = produce_to_old(b"stale-after")
            first = queued.result(timeout=20)
    finally:
        resume(bs.procs[old])

    for what, outcome in (("queued", first), ("right after", right_after)):
        assert outcome is not None, f"the deposed master acknowledged the {what} write"
        assert isinstance(outcome, REFUSALS), f"the {what} write failed with {outcome!r}"

    wait_until(
        lambda: (
            (s := status_of(bs, old)) is not None
            and s.role == "slave"
            and s.master_epoch == promoted.master_epoch
        ),
        10,
        what="the old master to report role slave",
    )
    with pytest.raises(NotMasterError):
        bs.clients[old].produce(TOPIC, [b"stale-late"])
    bs.clients[new].produce(TOPIC, [b"after-rejoin"])
    end = bs.clients[new].status().max_offset
    wait_until(
        lambda: (s := status_of(bs, old)) is not None and s.max_offset == end and s.confirm_offset == end,
        15,
        what="the old master to hold the new master's log",
    )
    assert bs.master_index() == new

    on_new = read_queues(bs.clients[new], TOPIC, QUEUES)
    assert read_queues(bs.clients[old], TOPIC, QUEUES) == on_new
    stored = sorted(b for q in on_new.values() for b in q)
    expected = sorted(
        [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)] + [b"after-rejoin"]
    )
    assert stored == expected, stored
    print(f"\nqueued write: {type(first).__name__}; write right after resume: {type(right_after).__name__}")


def test_master_cut_off_from_controller_with_a_slave_loses_no_acked_write(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(3, ha_idle_timeout_ms=30000, flush="sync")
    bs = cluster.bs
    old = bs.wait_master()
    elected, follower = [i for i in range(3) if i != old]
    bs.clients[old].produce(TOPIC, [b"before"])
    epoch1 = bs.clients[old].status().master_epoch
    controller = cluster.cc.procs[cluster.cc.ids[0]]

    pause(bs.procs[old])
    pause(bs.procs[follower])
    try:
        promoted = wait_until(
            lambda: (
                (s := status_of(bs, elected)) is not None
                and s.role == "master"
                and s.master_epoch > epoch1
                and s
            ),
            15,
            what="the third replica to be elected",
        )
        pause(controller)  # from here on, nobody learns anything from the controller
        resume(bs.procs[old])
        resume(bs.procs[follower])
        outcome = produce_to(bs.clients[old], b"acked-by-a-deposed-master")
    finally:
        resume(controller)
        resume(bs.procs[old])
        resume(bs.procs[follower])

    wait_until(
        lambda: all(
            (s := status_of(bs, i)) is not None
            and s.role == "slave"
            and s.master_epoch == promoted.master_epoch
            for i in (old, follower)
        ),
        15,
        what="both resumed replicas to follow the new master",
    )
    if outcome is not None:
        assert isinstance(outcome, REFUSALS), f"the write failed with {outcome!r}"
        return  # refused: nothing was promised
    end = bs.clients[elected].status().max_offset
    wait_until(
        lambda: all((s := status_of(bs, i)) is not None and s.max_offset == end for i in (old, follower)),
        15,
        what="the replicas to converge",
    )
    stored = [b for q in read_queues(bs.clients[elected], TOPIC, QUEUES).values() for b in q]
    assert b"acked-by-a-deposed-master" in stored, (
        f"a write acknowledged by the deposed master (epoch {epoch1}) is gone after epoch {promoted.master_epoch}"
    )


def produce_to(client: BrokerClient, body: bytes) -> BaseException | None:
    try:
        client.produce(TOPIC, [body], timeout=10)
    except Exception as exc:
        return exc
    return None
