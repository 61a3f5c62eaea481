"""Failover drills on a local cluster: produce, inject a fault, verify nothing acknowledged was lost.

`kill_master` runs a sync-replicated producer against a topic of one broker set, kills the
set's master with SIGKILL a third of the way in, restarts it (it must come back as a slave and
rejoin the SyncStateSet), keeps producing, then reads the whole topic back and reports:

- `acked`: messages the producer saw acknowledged;
- `acked_lost`: acknowledged messages that cannot be read back (must be 0);
- `duplicates`: extra copies read (a retried send whose first attempt was stored anyway);
- `max_write_gap_s`: the longest time between two acknowledgements (write unavailability);
- `failover_s`: from the kill until the controller named a new master;
- `rejoin_s`: from the kill until the old master was back in the SyncStateSet;
- `topic_deleted`: the drill's topic is deleted once read back, unless `keep_topic`.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog import localcluster
from tidelog.client import Client
from tidelog.errors import ConfigError, TidelogError, UnavailableError
from tidelog.invariants import present


def describe_set(client: Client, broker_set: str) -> Any:
    async def go() -> Any:
        reply = await client.aio.controller.describe_broker_sets([broker_set])
        return reply.broker_sets[0] if reply.broker_sets else None

    return client.runner.run(go())


def placement_violations(client: Client) -> list[tuple[str, str, str]]:
    """(broker set, code, reason) of every broker-set placement violation the leader sees now."""

    async def go() -> list[tuple[str, str, str]]:
        reply = await client.aio.controller.placement_audit()
        return [(v.broker_set, v.code, v.reason) for v in reply.violations if v.kind == "broker_set"]

    return client.runner.run(go())


def kill_master(
    data_dir: Path,
    broker_set: str,
    duration_s: float = 30.0,
    *,
    topic: str | None = None,
    queues: int = 4,
    on_event: Any = None,
    keep_topic: bool = False,
) -> dict[str, Any]:
    state = localcluster.read_state(data_dir)
    _check_drillable(state, data_dir, broker_set)
    note = on_event or (lambda _msg: None)
    topic = topic or f"drill-{int(time.time())}"
    with Client(state["controllers"], send_timeout=30.0, **localcluster.client_options(state)) as client:
        client.admin().create_topic(topic, queues=queues, broker_sets=[broker_set])
        load = Load(client.producer(), topic)
        t0 = time.monotonic()
        load.start()
        time.sleep(duration_s / 3)
        try:
            victim, before = _current_master(client, state, data_dir, broker_set)
        except TidelogError:
            load.stop()
            raise
        old_id = before.role.master_id
        note(f"killing master {victim['name']} (broker {old_id}, epoch {before.role.master_epoch})")
        failover = _Failover(old_id, time.monotonic())
        localcluster.kill(data_dir, victim["name"], signal.SIGKILL)
        _watch_failover(client, data_dir, broker_set, victim["name"], failover, t0 + duration_s, load, note)
        load.stop()
        if not failover.restarted:  # no failover in time: bring the victim back all the same
            localcluster.restart(data_dir, victim["name"])
            note(f"restarted {victim['name']} (no new master was named)")
        read = read_all(client, topic)
        report = _report(broker_set, topic, load, read, t0, failover)
        report["topic_deleted"] = not keep_topic and drop_topic(client, topic)
    return report


def drop_topic(client: Client, topic: str) -> bool:
    """Delete a drill's own topic once it was read back (drills would otherwise pile topics up);
    False if that failed, which only leaves the topic behind."""
    try:
        client.admin().delete_topic(topic)
    except TidelogError:
        return False
    return True


def _check_drillable(state: dict[str, Any], data_dir: Path, broker_set: str) -> None:
    """ConfigError unless `broker_set` is part of the cluster and has a replica to fail over to."""
    if broker_set not in state["broker_sets"]:
        raise ConfigError(
            f"broker set {broker_set!r} is not part of the cluster in {data_dir} "
            f"(it has {', '.join(state['broker_sets'])})"
        )
    replicas = sum(1 for p in state["processes"] if p.get("broker_set") == broker_set)
    if replicas < 2:
        raise ConfigError(
            f"broker set {broker_set!r} has {replicas} replica(s): killing its master leaves no "
            "replica to fail over to",
            hint="run the drill on a broker set of two or more replicas",
        )


def _current_master(
    client: Client, state: dict[str, Any], data_dir: Path, broker_set: str
) -> tuple[dict[str, Any], Any]:
    """(the master's process in cluster.json, the controller's view of the set) right now."""
    before = describe_set(client, broker_set)
    if before is None or not before.role.has_master:
        raise UnavailableError(f"broker set {broker_set} has no master to kill")
    victim = next((p for p in state["processes"] if p.get("address") == before.role.master_address), None)
    if victim is None:
        raise ConfigError(f"the master {before.role.master_address} was not started from {data_dir}")
    return victim, before


class Load:
    """A producer sending numbered messages from a thread until stopped; it keeps what was
    acknowledged (with when) and counts the sends that failed."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.acked: list[tuple[bytes, float]] = []
        self.failed = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="drill-producer", daemon=True)

    def _produce(self) -> None:
        seq = 0
        while not self.stopping.is_set():
            body = f"{self.topic}:{seq}".encode()
            seq += 1
            try:
                self.producer.send(self.topic, body)
                self.acked.append((body, time.monotonic()))
            except TidelogError:
                self.failed += 1

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def __enter__(self) -> Load:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def longest_gap(self, since: float) -> float:
        """The longest time without an acknowledgement from `since` to the last one."""
        times = [since] + [t for _, t in self.acked if t >= since]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


@dataclass
class _Failover:
    """What the drill saw after killing broker `old_id` at `t_kill`."""

    old_id: int
    t_kill: float
    failover_s: float | None = None  # until the controller named a new master
    rejoin_s: float | None = None  # until the old master was back in the SyncStateSet
    restarted: bool = False

    @property
    def complete(self) -> bool:
        return self.failover_s is not None and self.rejoin_s is not None

    def new_master(self, info: Any) -> bool:
        return info is not None and info.role.has_master and info.role.master_id != self.old_id

    def rejoined(self, info: Any) -> bool:
        return (
            info is not None
            and info.role.master_id != self.old_id
            and self.old_id in info.role.sync_state_set
        )


def _watch_failover(
    client: Client,
    data_dir: Path,
    broker_set: str,
    victim: str,
    failover: _Failover,
    deadline: float,
    load: Load,
    note: Any,
) -> None:
    """Watch the set until the drill's time is up and the failover and the rejoin were both seen
    (at most a minute longer): restart the victim once a new master is named, stop the load at
    the deadline."""
    while time.monotonic() < deadline or not failover.complete:
        if time.monotonic() > deadline + 60:
            break
        info = describe_set(client, broker_set)
        if failover.failover_s is None and failover.new_master(info):
            failover.failover_s = time.monotonic() - failover.t_kill
            note(
                f"new master: broker {info.role.master_id} (epoch {info.role.master_epoch}) "
                f"after {failover.failover_s:.1f}s"
            )
        if failover.failover_s is not None and not failover.restarted:
            localcluster.restart(data_dir, victim)
            failover.restarted = True
            note(f"restarted {victim}")
        if failover.failover_s is not None and failover.rejoin_s is None and failover.rejoined(info):
            failover.rejoin_s = time.monotonic() - failover.t_kill
            note(f"broker {failover.old_id} back in the SyncStateSet after {failover.rejoin_s:.1f}s")
        if time.monotonic() >= deadline:
            load.stopping.set()
        time.sleep(0.1)


def _report(
    broker_set: str, topic: str, load: Load, read: list[bytes], t0: float, failover: _Failover
) -> dict[str, Any]:
    counts = collections.Counter(read)
    acked_bodies = [b for b, _ in load.acked]
    times = [t0] + [t for _, t in load.acked]
    return {
        "broker_set": broker_set,
        "topic": topic,
        "acked": len(acked_bodies),
        "acked_lost": sum(1 for b in acked_bodies if counts[b] == 0),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "sends_failed": load.failed,
        "read": len(read),
        "max_write_gap_s": round(
            max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0), 3
        ),
        "failover_s": None if failover.failover_s is None else round(failover.failover_s, 3),
        "rejoin_s": None if failover.rejoin_s is None else round(failover.rejoin_s, 3),
        "killed_broker_id": failover.old_id,
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
                    current = present(route.broker_set(bs.name), f"the route lost broker set {bs.name}")
                    offsets = await aio.queue_offsets(current, topic, q)
                    if offset >= offsets.max:
                        break
                    msgs, nxt = await aio.pull(current, topic, q, offset, max_messages=1000, wait_ms=200)
                    out.extend(m.body for m in msgs)
                    offset = nxt
                    if not msgs and time.monotonic() > deadline:
                        break
        return out

    return client.runner.run(go())
