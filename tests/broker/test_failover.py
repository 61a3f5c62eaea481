"""Kill -9 the master under a steady sync-replicated write load; no acknowledged write is lost.

A producer follows the master (polling statuses) and retries each body until it is acked. The
master is killed, a new master must appear within the controller's heartbeat timeout (2 s in
the harness) + 3 s, writes continue, the killed broker restarts and rejoins the SyncStateSet.
Then every acked body must be readable, in order, from the new master and from every replica,
and all replicas must hold the same per-queue lists.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.broker.workload import FollowingProducer, check_log
from tests.brokers import read_queues, status_of
from tests.procs import wait_until

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 2.0  # ControllerCluster's default heartbeat_timeout_ms


@pytest.mark.parametrize(("replicas", "controllers"), [(2, 1), (3, 3)], ids=["2rep-1ctl", "3rep-3ctl"])
def test_kill_master_loses_no_acked_write(
    broker_cluster: Callable[..., BrokerCluster], replicas: int, controllers: int
) -> None:
    bs = broker_cluster(replicas, controllers, flush="sync", replication="sync").bs
    old = bs.wait_master()
    producer = FollowingProducer(bs, TOPIC, QUEUES).start()
    try:
        producer.wait_acks_since(0, 30, timeout=15)

        killed_at = time.monotonic()
        bs.procs[old].kill9()
        new = bs.wait_master(timeout=HEARTBEAT_TIMEOUT_S + 3.0, exclude=old)
        failover_s = time.monotonic() - killed_at
        producer.wait_acks_since(time.monotonic(), 20, timeout=15)  # writes go on under the new master

        bs.procs[old].start()
        bs.wait_in_sync(replicas, timeout=20)
        producer.wait_acks_since(time.monotonic(), 10, timeout=15)  # and with the old master back as slave
    finally:
        producer.stop()

    assert bs.master_index() == new
    master_max = bs.clients[new].status().max_offset
    # every replica holds the whole log and has learnt that all of it is confirmed
    wait_until(
        lambda: all(
            (s := status_of(bs, i)) is not None
            and s.max_offset == master_max
            and s.confirm_offset == master_max
            for i in range(replicas)
        ),
        15,
        what=f"every replica to hold and confirm offset {master_max}",
    )
    roles = sorted(s.role for s in bs.statuses() if s is not None)
    assert roles == ["master"] + ["slave"] * (replicas - 1), roles

    on_master = read_queues(bs.clients[new], TOPIC, QUEUES)
    check_log(on_master, producer, f"new master {new}")
    for i in range(replicas):
        if i != new:
            on_replica = read_queues(bs.clients[i], TOPIC, QUEUES)
            check_log(on_replica, producer, f"replica {i}")
            assert on_replica == on_master, f"replica {i} differs from the master"

    total = sum(len(v) for v in on_master.values())
    print(
        f"\n[{replicas} replicas, {controllers} controller(s)] acked {len(producer.acked)}, stored {total}, "
        f"uncertain {len(producer.uncertain)}, given up {len(producer.given_up)}, failover {failover_s:.2f}s, "
        f"write gap {producer.max_gap():.2f}s, errors {dict(producer.errors)}"
    )
    assert not producer.given_up, f"bodies never acknowledged: {producer.given_up}"


def test_rejoined_replica_stays_in_sync_while_idle(broker_cluster: Callable[..., BrokerCluster]) -> None:
    """After a failover with no write yet in the new epoch, the returning replica stays connected."""
    bs = broker_cluster(2).bs
    old = bs.wait_master()
    bs.clients[old].produce(TOPIC, [b"epoch-1"])
    bs.procs[old].kill9()
    new = bs.wait_master(timeout=HEARTBEAT_TIMEOUT_S + 3.0, exclude=old)
    bs.procs[old].start()
    bs.wait_in_sync(2, timeout=20)
    first = bs.clients[new].status()
    time.sleep(2.0)  # an observation window: nothing happens in it unless the connection churns
    later = bs.clients[new].status()
    assert len(later.sync_state_set) == 2 and all(r.connected for r in later.replicas), later
    assert later.sync_state_set_epoch == first.sync_state_set_epoch, (
        f"the SyncStateSet changed {later.sync_state_set_epoch - first.sync_state_set_epoch} times while idle"
    )
