"""Consumer-group offsets committed on the master survive kill -9 of the master."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.procs import wait_until

pytestmark = pytest.mark.slow


def test_committed_offsets_survive_failover(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2, flush="sync").bs
    old = bs.wait_master()
    master = bs.clients[old]
    for i in range(5 * QUEUES):  # every committed offset below stays within its queue
        master.produce(TOPIC, [b"m-%d" % i], queue=i % QUEUES)
    committed = {("g1", q): q + 1 for q in range(QUEUES)}
    committed[("g2", 0)] = 2
    for (group, q), offset in committed.items():
        master.commit(group, TOPIC, q, 0)
        master.commit(group, TOPIC, q, offset)  # the later commit wins
    for (group, q), offset in committed.items():
        assert master.fetch(group, TOPIC, q) == offset
    assert master.fetch("g2", TOPIC, 1) is None
    assert master.fetch("nobody", TOPIC, 0) is None

    bs.procs[old].kill9()
    new = bs.wait_master(timeout=10, exclude=old)
    client = bs.clients[new]
    got = {k: client.fetch(k[0], TOPIC, k[1]) for k in committed}
    assert got == committed
    assert client.fetch("g2", TOPIC, 1) is None

    # commits go on under the new master, and the old one learns them when it rejoins as a slave
    client.commit("g1", TOPIC, 0, 3)
    bs.procs[old].start()
    bs.wait_in_sync(2, timeout=20)
    assert bs.master_index() == new
    wait_until(
        lambda: bs.clients[old].fetch("g1", TOPIC, 0) == 3,
        10,
        what="the rejoined replica to apply the new commit",
    )
    for (group, q), offset in committed.items():
        if (group, q) != ("g1", 0):
            assert bs.clients[old].fetch(group, TOPIC, q) == offset
