"""Retention in running brokers (broker/retention.py, docs/ARCHITECTURE.md §6.4), real processes
over real sockets, 64 KiB segments and 1.5 s of retention (each producer runs for a few times that):

- a broker's disk use stays bounded while a producer runs, min offsets move on the master and
  the slave (and in `tide topic describe`), and a read below them gets OFFSET_BELOW_RETENTION;
- a slave that is down keeps the master from deleting what it still needs; it catches up when
  it returns, and the master's retention then moves on;
- a group's committed offset is still fetched, from the master and from a slave that folded its
  log again after a restart, once the segment holding the original commit is gone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import BrokerClient
from tests.procs import wait_until
from tidelog.broker.metrics import disk_used_bytes
from tidelog.errors import OffsetBelowRetentionError

pytestmark = pytest.mark.slow

SEG = 64 << 10
BODY = b"r" * 1000
RETENTION = {"segment_bytes": SEG, "retention_ms": 1500, "retention_check_interval_ms": 200}


def _produce_for(client: BrokerClient, seconds: float, on_tick: Callable[[], None] | None = None) -> int:
    """Send batches of 20 messages for `seconds`; returns the bytes of bodies acknowledged."""
    sent = 0
    end = time.monotonic() + seconds
    next_tick = time.monotonic() + 1
    while time.monotonic() < end:
        client.produce(TOPIC, [BODY] * 20)
        sent += 20 * len(BODY)
        if on_tick is not None and time.monotonic() >= next_tick:
            next_tick += 1
            on_tick()
    return sent


def _describe(controllers: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "topic",
            "describe",
            TOPIC,
            "--controllers",
            controllers,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def test_disk_use_stays_bounded_while_a_producer_runs(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2, **RETENTION)
    bs = cluster.bs
    m = bs.wait_master()
    s = 1 - m
    samples: list[tuple[int, int]] = []

    def sample() -> None:
        # Disk use as the broker reports it (tidelog_disk_used_bytes): allocated blocks. Apparent
        # sizes would count the key index's slot table, a 4 MiB hole that retention never
        # shrinks, against a bound that shrinks with what a loaded machine manages to send.
        samples.append((disk_used_bytes(bs.data_dirs[m]), disk_used_bytes(bs.data_dirs[s])))

    sent = _produce_for(bs.clients[m], 12, sample)
    # Without retention each replica would hold everything sent; with it, about what was sent
    # within the retention time plus a few segments. No rate is assumed: the bound is relative.
    # Half of 12 s leaves room for the deletions to trail by seconds on a loaded machine (the
    # suite runs two workers on two cores) while a retention that never deletes still fails.
    assert sent > 40 * SEG, f"only {sent} bytes produced: too few to judge retention"
    late = samples[len(samples) // 2 :]
    bound = sent // 2
    assert max(a for a, _ in late) < bound, f"master disk use {late} against {sent} bytes sent"
    assert max(b for _, b in late) < bound, f"slave disk use {late} against {sent} bytes sent"
    master, slave = bs.clients[m].status(), bs.clients[s].status()
    assert master.min_offset > 0 and slave.min_offset > 0
    assert slave.min_offset <= master.min_offset  # a slave never holds less than its master
    rows = _describe(cluster.controllers)
    assert any(int(str(r["min"])) > 0 for r in rows), rows
    with pytest.raises(OffsetBelowRetentionError):
        bs.clients[s].pull(TOPIC, 0, 0)
    q0 = bs.clients[m].offsets(TOPIC, 0)
    assert bs.clients[m].pull(TOPIC, 0, q0.min).messages  # what is kept reads as before


def test_a_slave_that_is_down_keeps_what_it_needs_and_catches_up(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    bs = broker_cluster(2, **RETENTION).bs
    m = bs.wait_master()
    s = 1 - m
    _produce_for(bs.clients[m], 1.5)
    wait_until(
        lambda: bs.clients[s].status().max_offset == bs.clients[m].status().max_offset, 10, what="catch-up"
    )
    held = bs.clients[s].status().max_offset
    bs.procs[s].stop()
    _produce_for(bs.clients[m], 6)  # far beyond the retention time
    status = bs.clients[m].status()
    assert status.max_offset - held > 8 * SEG
    assert status.min_offset <= held, "the master deleted what its stopped slave still needs"
    bs.procs[s].start()
    bs.wait_in_sync(2, timeout=30)
    wait_until(
        lambda: bs.clients[s].status().max_offset >= status.max_offset, 20, what="the slave to catch up"
    )
    # once the slave holds it, the master lets retention move past where the slave stopped
    wait_until(lambda: bs.clients[m].status().min_offset > held, 20, what="the master's min to move on")


def test_group_offsets_survive_retention(broker_cluster: Callable[..., BrokerCluster]) -> None:
    bs = broker_cluster(2, **RETENTION).bs
    m = bs.wait_master()
    s = 1 - m
    master = bs.clients[m]
    for q in range(QUEUES):
        master.produce(TOPIC, [b"first"] * 5, queue=q)
    master.commit("g", TOPIC, 1, 4)
    master.commit("g", TOPIC, 2, 3)
    commit_end = master.status().max_offset
    _produce_for(master, 4)
    wait_until(
        lambda: master.status().min_offset > commit_end and bs.clients[s].status().min_offset > commit_end,
        20,
        what="retention to delete the segment holding the commits on both replicas",
    )
    assert master.fetch("g", TOPIC, 1) == 4
    assert master.fetch("g", TOPIC, 2) == 3
    assert master.fetch("g", TOPIC, 0) is None
    bs.procs[s].stop()  # a restart folds the offsets again from what its log holds now
    bs.procs[s].start()
    wait_until(lambda: bs.clients[s].status().role == "slave", 20, what="the slave to come back")
    wait_until(lambda: bs.clients[s].fetch("g", TOPIC, 1) == 4, 10, what="the slave's refold")
    assert bs.clients[s].fetch("g", TOPIC, 2) == 3


def test_a_wiped_replica_joins_from_the_masters_min_offset(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    """Before retention ran, a wiped replica copied the whole log; once the start is gone, an
    empty replica begins where the master's log begins (ha/slavecore.py StartAt) and catches up."""
    bs = broker_cluster(2, **RETENTION).bs
    m = bs.wait_master()
    s = 1 - m
    master = bs.clients[m]
    master.commit("g", TOPIC, 0, 0)
    _produce_for(master, 4)
    wait_until(lambda: master.status().min_offset > 0, 20, what="retention on the master")
    bs.procs[s].stop()
    shutil.rmtree(bs.data_dirs[s])
    bs.procs[s].start()
    wait_until(
        lambda: (st := bs.clients[s].status()).role == "slave" and st.min_offset > 0,
        30,
        what="the wiped replica to start at the master's min",
    )
    end = master.status().max_offset
    wait_until(lambda: bs.clients[s].status().max_offset >= end, 30, what="the wiped replica to catch up")
    bs.wait_in_sync(2, timeout=30)
    assert bs.clients[s].fetch("g", TOPIC, 0) == 0  # the carried group commit is in what it copied
    q = master.offsets(TOPIC, 1)
    assert [x.body for x in bs.clients[s].pull(TOPIC, 1, q.min, max_messages=5).messages] == [
        x.body for x in master.pull(TOPIC, 1, q.min, max_messages=5).messages
    ]
