"""A master keeps acknowledging while no controller answers, where the replication rule makes it
safe (docs/ARCHITECTURE.md §3.5), and stops where only the lease could.

Each test pauses (SIGSTOP) the only controller and produces through the master for several lease
lengths (the controllers' heartbeat timeout is 2 s here, so a lease lasts 1.5 s): with the lease as
the only guard every write after the first 1.5 s would be refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import pause, read_queues, resume, status_of
from tests.procs import wait_until
from tidelog.errors import NotMasterError

pytestmark = pytest.mark.slow

OUTAGE_S = 6.0  # four lease lengths: the lease alone would have stopped every write after 1.5 s


def produce_through_outage(cluster: BrokerCluster, tag: bytes) -> tuple[list[bytes], list[BaseException]]:
    """Pause the controller, produce one message at a time for OUTAGE_S, resume it; what was
    acknowledged and what was refused."""
    bs = cluster.bs
    m = bs.wait_master()
    controller = cluster.cc.procs[cluster.cc.ids[0]]
    acked: list[bytes] = []
    refused: list[BaseException] = []
    pause(controller)
    try:
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < OUTAGE_S:
            body = b"%s-%d" % (tag, i)
            i += 1
            try:
                bs.clients[m].produce(TOPIC, [body], timeout=5)
                acked.append(body)
            except NotMasterError as exc:
                refused.append(exc)
                time.sleep(0.05)  # pacing a refused retry loop, not ordering events
    finally:
        resume(controller)
    return acked, refused


def test_a_running_producer_is_acknowledged_through_a_controller_outage(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(2, flush="sync")
    bs = cluster.bs
    m = bs.wait_master()
    s = 1 - m
    acked, refused = produce_through_outage(cluster, b"outage")
    assert not refused, (
        f"the master refused {len(refused)} writes while the controller was away: {refused[0]}"
    )
    assert len(acked) >= 20, acked
    # the role never changed, and every acknowledged write is on both replicas, byte for byte
    end = bs.clients[m].status().max_offset
    wait_until(
        lambda: (st := status_of(bs, s)) is not None and st.max_offset == end and st.confirm_offset == end,
        15,
        what="the slave to hold and confirm the master's log",
    )
    assert bs.master_index() == m
    on_master = read_queues(bs.clients[m], TOPIC, QUEUES)
    assert read_queues(bs.clients[s], TOPIC, QUEUES) == on_master
    stored = {b for q in on_master.values() for b in q}
    assert set(acked) <= stored


def test_with_unclean_elections_enabled_the_lease_still_stops_writes(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    """docs/ARCHITECTURE.md §3.5 step 7: an unclean election could pick a broker outside the set,
    which no ack protects, so the lease stays the guard."""
    cluster = broker_cluster(
        2, flush="sync", controller_options={"extra": {"enable_elect_unclean_master": True}}
    )
    acked, refused = produce_through_outage(cluster, b"unclean")
    assert refused, "a master acknowledged writes for four lease lengths while unclean elections were on"
    assert "cannot confirm with the controller" in str(refused[0])
