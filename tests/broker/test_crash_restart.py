"""A master that crashed and restarted before the controller noticed never goes on in the epoch it
led (broker/server.py `_must_not_resume`): its log may have lost a tail a slave holds, and in one
epoch fork repair cannot tell the two apart (the simulator's seed 243).
It stays silent until the controller elects anew, so the next mastership is a new epoch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import read_queues, status_of
from tests.procs import wait_until

pytestmark = pytest.mark.slow


def test_a_master_restarted_after_a_crash_leads_only_a_new_epoch(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    # a long heartbeat timeout: the crashed master is back long before the controller would notice
    # (20 s: a restart under a loaded machine took 7.5 s; the path tested costs no wait at all)
    bs = broker_cluster(2, controller_options={"heartbeat_timeout_ms": 20000}).bs
    old = bs.wait_master()
    for i in range(10):
        bs.clients[old].produce(TOPIC, [b"before-%d" % i])
    epoch = bs.clients[old].status().master_epoch
    bs.procs[old].kill9()
    bs.procs[old].start()  # back at once, before the controller's timeout
    master = wait_until(
        lambda: next(
            (
                s
                for i in (0, 1)
                if (s := status_of(bs, i)) is not None and s.role == "master" and s.master_epoch > epoch
            ),
            None,
        ),
        30,
        what="a master of a new epoch",
    )
    assert master.master_epoch > epoch
    new = bs.master_index()
    bs.clients[new].produce(TOPIC, [b"after"])
    bs.wait_in_sync(2, timeout=20)
    end = bs.clients[new].status().max_offset
    wait_until(
        lambda: all((s := status_of(bs, i)) is not None and s.max_offset == end for i in (0, 1)),
        15,
        what="both replicas to hold the log",
    )
    on_master = read_queues(bs.clients[new], TOPIC, QUEUES)
    assert read_queues(bs.clients[1 - new], TOPIC, QUEUES) == on_master
    stored = sorted(b for q in on_master.values() for b in q)
    assert stored == sorted([b"before-%d" % i for i in range(10)] + [b"after"])
    assert "restarted after a crash as master of epoch" in bs.logs()
