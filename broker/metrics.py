"""A broker's Prometheus metrics: what it counts as requests pass, and what it reads at scrape time.

Events are counted where they happen, once per request or per fdatasync, never per message:
produce and pull counts and bytes (from the reply of each acknowledged call, seen by the gRPC
interceptor `tidelog.metrics.RpcTimer`), request latency per method, the time a write waits for
its replicas' acks (`Replica.persist`), the time and size of each group commit (the commit log's
flusher thread). State is read when Prometheus scrapes (`BrokerCollector`): role, epoch, offsets,
the SyncStateSet, replication lag per slave from the master's view, disk use, and consumer lag
per group and queue. Every series carries `broker_set` and `broker_id`. The names are listed in
deploy/METRICS.md; the HTTP endpoint is `tidelog.metrics.MetricsServer`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tidelog.broker.replica import MASTER, NONE, SLAVE, Replica
from tidelog.ha.master import HaMaster
from tidelog.metrics import MetricsServer, RpcMetrics, RpcTimer, new_registry, start_server

IDENTITY = ("broker_set", "broker_id")
ACK_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
FLUSH_SIZE_BUCKETS = tuple(float(4 << (2 * i)) for i in range(14))  # 4 B .. 256 MiB, ×4


@dataclass(frozen=True)
class SlaveLag:
    """How far one slave is behind, as its master sees it."""

    slave_id: int
    connected: bool
    lag_bytes: int
    lag_seconds: float | None  # None: never seen caught up by this master


def slave_lags(
    master_max: int,
    acks: dict[int, int],
    departed: dict[int, int],
    caught_up_ms: dict[int, int | None],
    now_ms: int,
) -> list[SlaveLag]:
    """The lag of every slave a master knows (connected ones by their ack, gone ones by their last).

    Bytes: the master's end minus what the slave acknowledged. Seconds: 0 while it holds
    everything, else the time since it last did (`caught_up_ms`, the SyncStateSet tracker's)."""
    out = []
    for sid in sorted(set(acks) | set(departed)):
        ack = acks.get(sid, departed.get(sid, -1))
        behind = max(0, master_max - max(ack, 0))
        since = caught_up_ms.get(sid)
        if behind == 0:
            seconds: float | None = 0.0
        else:
            seconds = None if since is None else max(0.0, (now_ms - since) / 1000)
        out.append(SlaveLag(sid, sid in acks, behind, seconds))
    return out


def consumer_lags(
    committed: dict[tuple[str, str, int], tuple[int, int]],
    served: dict[str, int],
    marked_at: dict[str, int],
    queue_max: Any,
) -> list[tuple[str, str, int, int]]:
    """(group, topic, queue, messages behind) for each group's commit of a topic served now.

    A commit older than the topic's latest generation marker belongs to a deleted topic of the
    same name and is left out, as are queues the topic no longer has (bounded cardinality: only
    groups that committed). `queue_max(topic, queue)` is the queue's end."""
    out = []
    for (group, topic, queue), (offset, at) in sorted(committed.items()):
        if queue >= served.get(topic, 0) or at < marked_at.get(topic, -1):
            continue
        out.append((group, topic, queue, max(0, queue_max(topic, queue) - offset)))
    return out


def disk_used_bytes(directory: Path) -> int:
    """Bytes the files under `directory` occupy on disk (allocated blocks, not apparent sizes)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # removed meanwhile (retention, a cut queue)
                continue
    return total


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*IDENTITY, *labels])


class BrokerCollector(Collector):
    """The broker's state, read at scrape time on the event loop that changes it."""

    def __init__(self, replica: Replica, data_dir: Path) -> None:
        self.replica = replica
        self.data_dir = data_dir

    def identity(self) -> list[str]:
        return [self.replica.cfg.broker_set, str(self.replica.broker_id)]

    def collect(self) -> Iterator[Metric]:
        ident = self.identity()
        yield from self._role_and_offsets(ident)
        yield from self._disk(ident)
        master = self.replica.ha_master
        if self.replica.role == MASTER and master is not None:
            yield from self._replication(ident, master)
            yield self._consumer_lag(ident)

    def _role_and_offsets(self, ident: list[str]) -> Iterator[Metric]:
        r, log = self.replica, self.replica.log
        role = _gauge(
            "tidelog_broker_role", "1 for the broker's current role (master, slave, none)", ("role",)
        )
        for name in (MASTER, SLAVE, NONE):
            role.add_metric([*ident, name], 1.0 if r.role == name else 0.0)
        yield role
        epoch = _gauge("tidelog_broker_epoch", "The master epoch this broker was last told of")
        epoch.add_metric(ident, r.master_epoch)
        yield epoch
        for name, value, doc in (
            (
                "tidelog_commitlog_min_offset",
                log.min_offset,
                "First physical offset still held (moves with retention)",
            ),
            (
                "tidelog_commitlog_max_offset",
                log.max_offset,
                "End of the commit log (physical offset, bytes)",
            ),
            (
                "tidelog_commitlog_confirm_offset",
                log.confirm_offset,
                "Physical offset below which every in-sync member holds the data",
            ),
            (
                "tidelog_commitlog_flushed_offset",
                log.flushed_offset,
                "Physical offset below which fdatasync covered every byte",
            ),
        ):
            g = _gauge(name, doc)
            g.add_metric(ident, value)
            yield g
        master = r.ha_master
        changes = CounterMetricFamily(
            "tidelog_sync_state_set_changes",
            "Changes of the broker set's SyncStateSet, elections included (its set epoch)",
            labels=list(IDENTITY),
        )
        changes.add_metric(ident, master.tracker.sss_epoch if master is not None else r.last_sss_epoch)
        yield changes

    def _disk(self, ident: list[str]) -> Iterator[Metric]:
        used = _gauge("tidelog_disk_used_bytes", "Bytes the broker's data directory occupies on disk")
        used.add_metric(ident, disk_used_bytes(self.data_dir))
        yield used
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return
        free = _gauge(
            "tidelog_disk_free_bytes", "Bytes free for the broker on its data directory's file system"
        )
        free.add_metric(ident, st.f_bavail * st.f_frsize)
        yield free

    def _replication(self, ident: list[str], master: HaMaster) -> Iterator[Metric]:
        size = _gauge("tidelog_sync_state_set_size", "Members of the SyncStateSet, the master included")
        size.add_metric(ident, len(master.tracker.local))
        yield size
        tracker = master.tracker
        known = set(master.acks()) | set(master.departed_acks)
        lags = slave_lags(
            self.replica.log.max_offset,
            master.acks(),
            master.departed_acks,
            {sid: tracker.caught_up_ms(sid) for sid in known},
            int(time.time() * 1000),
        )
        lag_bytes = _gauge(
            "tidelog_ha_lag_bytes",
            "Bytes the master holds that the slave has not acknowledged",
            ("slave_id",),
        )
        lag_seconds = _gauge(
            "tidelog_ha_lag_seconds",
            "Seconds since the slave last held everything the master had",
            ("slave_id",),
        )
        connected = _gauge(
            "tidelog_ha_slave_connected", "1 while the slave's replication connection is open", ("slave_id",)
        )
        in_sync = _gauge(
            "tidelog_ha_slave_in_sync", "1 while the slave is in the SyncStateSet", ("slave_id",)
        )
        for lag in lags:
            labels = [*ident, str(lag.slave_id)]
            lag_bytes.add_metric(labels, lag.lag_bytes)
            if lag.lag_seconds is not None:
                lag_seconds.add_metric(labels, lag.lag_seconds)
            connected.add_metric(labels, 1.0 if lag.connected else 0.0)
            in_sync.add_metric(labels, 1.0 if lag.slave_id in tracker.local else 0.0)
        yield from (lag_bytes, lag_seconds, connected, in_sync)
        sent = CounterMetricFamily(
            "tidelog_ha_sent_bytes",
            "Record bytes this mastership streamed to its slaves: with os.sendfile from the page "
            "cache (plain TCP), or read and written (TLS, or what a full socket did not take)",
            labels=[*IDENTITY, "how"],
        )
        sent.add_metric([*ident, "sendfile"], master.sent_zero_copy)
        sent.add_metric([*ident, "copied"], master.sent_copied)
        yield sent

    def _consumer_lag(self, ident: list[str]) -> Metric:
        r = self.replica
        marks = r.topic_table.marks
        marks.refresh()
        served = dict(r.topics)
        lag = _gauge(
            "tidelog_consumer_lag_messages",
            "Messages of the queue after the group's committed offset",
            ("group", "topic", "queue"),
        )
        for group, topic, queue, behind in consumer_lags(
            r.offsets.committed(),
            served,
            {t: marks.marked_at(t) for t in served},
            lambda t, q: r.log.queue_offsets(t, q).max,
        ):
            lag.add_metric([*ident, group, topic, str(queue)], behind)
        return lag


class RetentionCounts(Protocol):
    """What the retention loop counts (broker/retention.py)."""

    deleted_segments: int
    carried_records: int
    cut_messages: int


class RetentionCollector(Collector):
    """Retention's work so far, read at scrape time."""

    def __init__(self, identity: Callable[[], list[str]], counts: RetentionCounts) -> None:
        self.identity = identity
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        ident = self.identity()
        for name, value, doc in (
            (
                "tidelog_retention_deleted_segments",
                self.counts.deleted_segments,
                "Whole segments retention deleted",
            ),
            (
                "tidelog_retention_carried_records",
                self.counts.carried_records,
                "Group commits and topic markers copied forward before their segment went",
            ),
            (
                "tidelog_retention_cut_messages",
                self.counts.cut_messages,
                "Messages made unreadable by their topic's own, shorter retention",
            ),
        ):
            counter = CounterMetricFamily(name, doc, labels=list(IDENTITY))
            counter.add_metric(ident, value)
            yield counter


class BrokerMetrics:
    """One broker's registry, its event metrics, its collector and its HTTP endpoint."""

    def __init__(self, replica: Replica, data_dir: Path) -> None:
        self.replica = replica
        self.registry = new_registry()
        self.registered = False  # set by the broker process once the controller accepted it
        self.rpc = RpcMetrics(self.registry, IDENTITY)
        per_topic = [*IDENTITY, "topic"]
        reg = self.registry
        self.produced = Counter(
            "tidelog_produced_messages", "Messages acknowledged to producers", per_topic, registry=reg
        )
        self.produced_bytes = Counter(
            "tidelog_produced_bytes", "Bytes of the acknowledged Produce requests", per_topic, registry=reg
        )
        self.pulled = Counter(
            "tidelog_pulled_messages", "Messages returned to Pull requests", per_topic, registry=reg
        )
        self.pulled_bytes = Counter(
            "tidelog_pulled_bytes", "Bytes of the Pull replies", per_topic, registry=reg
        )
        self.ack_wait = Histogram(
            "tidelog_ack_wait_seconds",
            "Time a write waited for its in-sync replicas' acks",
            IDENTITY,
            registry=reg,
            buckets=ACK_WAIT_BUCKETS,
        )
        self.fsync = Histogram(
            "tidelog_commitlog_fsync_seconds",
            "Time one fdatasync of the commit log took",
            IDENTITY,
            registry=reg,
            buckets=FSYNC_BUCKETS,
        )
        self.flush_size = Histogram(
            "tidelog_commitlog_flush_size_bytes",
            "Bytes one fdatasync made durable (the group commit's size)",
            IDENTITY,
            registry=reg,
            buckets=FLUSH_SIZE_BUCKETS,
        )
        self.collector = BrokerCollector(replica, Path(replica.cfg.data_dir))
        self.registry.register(self.collector)
        self._server: MetricsServer | None = None
        self._children: dict[tuple[int, str, str, str], tuple[Any, Any]] = {}
        replica.observe_ack_wait = self.on_ack_wait
        replica.observe_traffic = self.on_traffic
        replica.log.flush_listeners.append(self.on_flush)

    def watch_retention(self, counts: RetentionCounts) -> None:
        """Export the retention loop's counters (it starts after the metrics)."""
        self.registry.register(RetentionCollector(self.collector.identity, counts))

    def identity(self) -> tuple[str, str]:
        return self.replica.cfg.broker_set, str(self.replica.broker_id)

    def interceptor(self) -> RpcTimer:
        return RpcTimer(self.on_rpc)

    def on_rpc(self, method: str, request: Any, reply: Any, seconds: float, code: str) -> None:
        ident = self.identity()
        self.rpc.observe(ident, method, seconds, code)
        if method == "Pull" and reply is not None and reply.messages:  # the pull of message objects
            self.on_traffic("pulled", request.topic, len(reply.messages), reply.ByteSize())

    def on_traffic(self, kind: str, topic: str, messages: int, size: int) -> None:
        """A request answered, on any transport (gRPC or the data port)."""
        pair = (
            (self.produced, self.produced_bytes) if kind == "produced" else (self.pulled, self.pulled_bytes)
        )
        counted, sized = self._per_topic(*pair, self.identity(), topic)
        counted.inc(messages)
        sized.inc(size)

    def _per_topic(
        self, messages: Counter, size: Counter, ident: tuple[str, str], topic: str
    ) -> tuple[Any, Any]:
        """The (messages, bytes) counters of one topic, looked up once (a request then costs two adds)."""
        key = (id(messages), *ident, topic)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (messages.labels(*ident, topic), size.labels(*ident, topic))
        return children

    def on_ack_wait(self, seconds: float) -> None:
        self.ack_wait.labels(*self.identity()).observe(seconds)

    def on_flush(self, seconds: float, size: int) -> None:
        # the flusher thread: prometheus_client's values are thread-safe
        ident = self.identity()
        self.fsync.labels(*ident).observe(seconds)
        self.flush_size.labels(*ident).observe(size)

    def ready(self) -> str | None:
        """Why this broker is not ready, or None: registered with the controller and its role known."""
        if not self.registered:
            return "not registered with the controller yet"
        if self.replica.role not in (MASTER, SLAVE):
            return f"broker {self.replica.broker_id} has no role yet (its broker set has no master)"
        return None

    async def start(self, address: str) -> None:
        self._server = await start_server(address, self.registry, self.ready)

    @property
    def address(self) -> str:
        return self._server.bound if self._server is not None else ""

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
        if self.on_flush in self.replica.log.flush_listeners:
            self.replica.log.flush_listeners.remove(self.on_flush)
