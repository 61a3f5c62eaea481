"""Failover drills on a local cluster: produce, inject a fault, verify nothing acknowledged was lost.

`kill_master` runs a sync-replicated producer against a topic of one broker set, kills the
set's master with SIGKILL a third of the way in, restarts it (it must come back as a slave and
rejoin the SyncStateSet), keeps producing, then reads the whole topic back and reports:

- `acked`: messages the producer saw acknowledged;
- `acked_lost`: acknowledged messages that cannot be read back (must be 0);
- `duplicates`: extra copies read (a retried send whose first attempt was stored anyway);
- `max_write_gap_s`: the longest time between two acknowledgements (write unavailability);
- `failover_s`: from the kill until the controller named a new master;
- `rejoin_s`: from the kill until the old master was back in the SyncStateSet.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path
from typing import Any

from tidelog import localcluster
from tidelog.client import Client
from tidelog.errors import ConfigError, TidelogError, UnavailableError


def describe_set(client: Client, broker_set: str) -> Any:
    async def go() -> Any:
        reply = await client.aio.controller.describe_broker_sets([broker_set])
        return reply.broker_sets[0] if reply.broker_sets else None
    return client._loop.run(go())


def placement_violations(client: Client) -> list[tuple[str, str, str]]:
    """(broker set, code, reason) of every broker-set placement violation the leader sees now."""
    async def go() -> list[tuple[str, str, str]]:
        reply = await client.aio.controller.placement_audit()
        return [(v.broker_set, v.code, v.reason) for v in reply.violations if v.kind == "broker_set"]
    return client._loop.run(go())


def kill_master(data_dir: Path, broker_set: str, duration_s: float = 30.0, *, topic: str | None = None,
                queues: int = 4, on_event: Any = None) -> dict[str, Any]:
    state = localcluster.read_state(data_dir)
    if broker_set not in state["broker_sets"]:
        raise ConfigError(f"broker set {broker_set!r} is not part of the cluster in {data_dir} "
                          f"(it has {', '.join(state['broker_sets'])})")
    replicas = sum(1 for p in state["processes"] if p.get("broker_set") == broker_set)
    if replicas < 2:
        raise ConfigError(f"broker set {broker_set!r} has {replicas} replica(s): killing its master leaves no "
                          "replica to fail over to", hint="run the drill on a broker set of two or more replicas")
    note = on_event or (lambda _msg: None)
    topic = topic or f"drill-{int(time.time())}"
    with Client(state["controllers"], send_timeout=30.0) as client:
        client.admin().create_topic(topic, queues=queues, broker_sets=[broker_set])
        producer = client.producer()
        acked: list[tuple[bytes, float]] = []
        failed = 0
        stop = threading.Event()

        def produce() -> None:
            nonlocal failed
            seq = 0
            while not stop.is_set():
                body = f"{topic}:{seq}".encode()
                seq += 1
                try:
                    producer.send(topic, body)
                    acked.append((body, time.monotonic()))
                except TidelogError:
                    failed += 1

        t0 = time.monotonic()
        thread = threading.Thread(target=produce, name="drill-producer", daemon=True)
        thread.start()
        time.sleep(duration_s / 3)
        before = describe_set(client, broker_set)
        if before is None or not before.role.has_master:
            stop.set()
            thread.join()
            raise UnavailableError(f"broker set {broker_set} has no master to kill")
        old_id = before.role.master_id
        victim = next((p for p in state["processes"] if p.get("address") == before.role.master_address), None)
        if victim is None:
            stop.set()
            thread.join()
            raise ConfigError(f"the master {before.role.master_address} was not started from {data_dir}")
        note(f"killing master {victim['name']} (broker {old_id}, epoch {before.role.master_epoch})")
        t_kill = time.monotonic()
        localcluster.kill(data_dir, victim["name"], signal.SIGKILL)
        failover_s = rejoin_s = None
        restarted = False
        deadline = t0 + duration_s
        while time.monotonic() < deadline or failover_s is None or rejoin_s is None:
            if time.monotonic() > deadline + 60:
                break
            info = describe_set(client, broker_set)
            if info is not None and info.role.has_master and info.role.master_id != old_id and failover_s is None:
                failover_s = time.monotonic() - t_kill
                note(f"new master: broker {info.role.master_id} (epoch {info.role.master_epoch}) "
                     f"after {failover_s:.1f}s")
            if failover_s is not None and not restarted:
                localcluster.restart(data_dir, victim["name"])
                restarted = True
                note(f"restarted {victim['name']}")
            if info is not None and failover_s is not None and rejoin_s is None \
                    and old_id in info.role.sync_state_set and info.role.master_id != old_id:
                rejoin_s = time.monotonic() - t_kill
                note(f"broker {old_id} back in the SyncStateSet after {rejoin_s:.1f}s")
            if time.monotonic() >= deadline and not stop.is_set():
                stop.set()
            time.sleep(0.1)
        stop.set()
        thread.join()
        if not restarted:  # no failover in time: bring the victim back all the same
            localcluster.restart(data_dir, victim["name"])
            note(f"restarted {victim['name']} (no new master was named)")
        read = read_all(client, topic)
    counts = collections.Counter(read)
    acked_bodies = [b for b, _ in acked]
    times = [t0] + [t for _, t in acked]
    return {
        "broker_set": broker_set,
        "topic": topic,
        "acked": len(acked_bodies),
        "acked_lost": sum(1 for b in acked_bodies if counts[b] == 0),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "sends_failed": failed,
        "read": len(read),
        "max_write_gap_s": round(max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0), 3),
        "failover_s": None if failover_s is None else round(failover_s, 3),
        "rejoin_s": None if rejoin_s is None else round(rejoin_s, 3),
        "killed_broker_id": old_id,
    }


def read_all(client: Client, topic: str, settle_s: float = 20.0) -> list[bytes]:
    """Every message of the topic, read up to each queue's max offset (waiting for it to be confirmed)."""

    async def go() -> list[bytes]:
        aio = client.aio
        deadline = time.monotonic() + settle_s
        route = await aio.route(topic, refresh=True)
        out: list[bytes] = []
        for bs in route.broker_sets:
            for q in range(bs.queues):
                offset = 0
                while True:
                    route = await aio.route(topic, refresh=True)
                    current = route.broker_set(bs.name)
                    assert current is not None
                    offsets = await aio.queue_offsets(current, topic, q)
                    if offset >= offsets.max:
                        break
                    msgs, nxt = await aio.pull(current, topic, q, offset, max_messages=1000, wait_ms=200)
                    out.extend(m.body for m in msgs)
                    offset = nxt
                    if not msgs and time.monotonic() > deadline:
                        break
        return out

    return client._loop.run(go())
