"""No acknowledgement waits for a timer: every step of a write is woken by the event that satisfies it.

With the periodic timers stretched to seconds (`flush_interval_ms`, `ha_heartbeat_interval_ms`,
the controller heartbeat), a
write that depended on a tick anywhere on its path (master fsync -> HA send -> slave fsync ->
ack -> confirm -> release) would take seconds; each must finish within 1 s. A bounded wait for
liveness, not a speed assertion: with nothing wrong a send takes milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import TOPIC, BrokerCluster
from tidelog.client import Client
from tidelog.ledger import Ledgers

pytestmark = pytest.mark.slow

# The controller heartbeat also releases waiters (it refreshes the SyncStateSet): stretch it too,
# or a missed wake-up would be hidden behind it.
SLOW_TIMERS = {
    "flush": "sync",
    "flush_interval_ms": 5000,
    "ha_heartbeat_interval_ms": 5000,
    "ha_idle_timeout_ms": 20000,
    "heartbeat_interval_ms": 3000,
    "controller_options": {"heartbeat_interval_ms": 3000, "heartbeat_timeout_ms": 15000},
}
BOUND_S = 1.0


def _each_within(bound: float, count: int, op: Callable[[int], object]) -> list[float]:
    took = []
    for i in range(count):
        t0 = time.monotonic()
        op(i)
        took.append(time.monotonic() - t0)
    slow = [(i, round(t, 3)) for i, t in enumerate(took) if t > bound]
    assert not slow, f"{len(slow)} of {count} operations took over {bound}s: {slow[:10]}"
    return took


def test_sync_flush_sends_never_wait_for_a_tick(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2, **SLOW_TIMERS)
    with Client(cluster.controllers) as client:
        producer = client.producer()
        producer.send(TOPIC, b"warm-up")
        sent: dict[tuple[int, int], bytes] = {}

        def send(i: int) -> None:
            body = f"m{i}".encode() * 64
            receipt = producer.send(TOPIC, body, key=f"k{i % 7}")
            sent[(receipt.queue, receipt.queue_offset)] = body

        _each_within(BOUND_S, 200, send)
    # the fast path must not have skipped durability: every acknowledged message reads back
    master = cluster.bs.wait_master()
    bc = cluster.bs.clients[master]
    for (queue, offset), body in sent.items():
        got = bc.pull(TOPIC, queue, offset, max_messages=1).messages
        assert got and got[0].body == body


def test_ledger_adds_never_wait_for_a_tick(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2, **SLOW_TIMERS)
    with Client(cluster.controllers) as client:
        ledgers = Ledgers(client)
        writer = ledgers.create_ledger(2, 2, 2, password=b"pw")
        writer.add_entry(b"warm-up")
        _each_within(BOUND_S, 200, lambda i: writer.add_entry(f"entry-{i}".encode() * 16))
        reader = ledgers.open_ledger(writer.ledger_id, b"pw", recovery=True)
        assert reader.last_add_confirmed == 200
        entries = reader.read_entries(1, 200)
        assert [e.data for e in entries] == [f"entry-{i}".encode() * 16 for i in range(200)]
