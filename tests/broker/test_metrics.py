"""broker/metrics.py: the pure lag rules, and a real in-process master's metrics as a scrape sees them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from tidelog.broker import config
from tidelog.broker.metrics import BrokerMetrics, SlaveLag, consumer_lags, disk_used_bytes, slave_lags
from tidelog.broker.replica import Replica, Role
from tidelog.commitlog import CommitLog
from tidelog.metrics import respond
from tidelog.proto import broker_pb2 as pb

SET = "broker-a"


def test_slave_lag_is_bytes_behind_and_time_since_last_caught_up() -> None:
    lags = slave_lags(
        1000,
        acks={2: 1000, 3: 400},
        departed={4: 100, 2: 50},  # a connected slave's own ack wins over its departed one
        caught_up_ms={2: 9_000, 3: 7_500, 4: None},
        now_ms=10_000,
    )
    assert lags == [
        SlaveLag(2, True, 0, 0.0),
        SlaveLag(3, True, 600, 2.5),
        SlaveLag(4, False, 900, None),  # never seen caught up by this master: no time
    ]


def test_slave_lag_of_a_slave_that_never_acked_counts_the_whole_log() -> None:
    assert slave_lags(500, {2: -1}, {}, {2: None}, 1) == [SlaveLag(2, True, 500, None)]


def test_consumer_lag_only_for_served_queues_and_current_generations() -> None:
    committed = {
        ("g1", "t", 0): (3, 100),
        ("g1", "t", 1): (9, 100),  # beyond the end (a truncated log): no negative lag
        ("g1", "t", 7): (1, 100),  # the topic has 2 queues here now
        ("g2", "t", 0): (1, 10),  # from before the topic's latest marker: a deleted namesake's
        ("g1", "gone", 0): (1, 100),  # a topic not served any more
    }
    ends = {("t", 0): 10, ("t", 1): 5}
    got = consumer_lags(committed, {"t": 2}, {"t": 50}, lambda t, q: ends[(t, q)])
    assert got == [("g1", "t", 0, 7), ("g1", "t", 1, 0)]


def test_disk_use_counts_allocated_blocks(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 10_000)
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 30)  # a gigabyte that takes no room
    used = disk_used_bytes(tmp_path)
    assert 10_000 <= used < 1 << 20


def _replica(tmp_path: Path) -> Replica:
    cfg = config.from_mapping(
        {
            "broker_set": SET,
            "data_dir": str(tmp_path),
            "controllers": "127.0.0.1:1",
            "secret": "a-real-secret-for-the-tests-0123456789",
            "flush": "sync",
            "metrics_address": "127.0.0.1:9999",  # not started here
        }
    )
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush="sync")
    return Replica(cfg, log, broker_id=1)


async def _master(replica: Replica) -> None:
    await replica.apply_role(Role(True, 1, "127.0.0.1:1", "127.0.0.1:2", 1, frozenset({1}), 1))
    replica.lease.renew(replica.clock_ms(), 80_000, epoch=1, unclean_elections=True)
    replica.topic_table.update(SET, [SimpleNamespace(name="t", queues={SET: 2}, generation=1)], [])


def test_a_master_exports_its_events_and_state(tmp_path: Path) -> None:
    asyncio.run(_master_exports(tmp_path))


async def _master_exports(tmp_path: Path) -> None:
    replica = _replica(tmp_path)
    metrics = BrokerMetrics(replica, tmp_path)
    value = metrics.registry.get_sample_value
    ident = {"broker_set": SET, "broker_id": "1"}
    assert metrics.ready() == "not registered with the controller yet"
    metrics.registered = True
    assert "no role yet" in (metrics.ready() or "")
    await _master(replica)
    assert metrics.ready() is None
    try:
        request = pb.ProduceRequest(topic="t", messages=[pb.ProduceMessage(body=b"m" * 100, queue=0)] * 5)
        placed = await replica.produce("t", [(m.body, None, None, None, 0) for m in request.messages])
        reply = pb.ProduceReply(results=[pb.ProduceResult(queue=q) for _, q in placed])
        metrics.on_rpc("Produce", request, reply, 0.002, "OK")
        metrics.on_rpc("Produce", request, None, 0.001, "NOT_MASTER")  # refused: not counted as produced
        # the service reports what it answered, whichever transport carried it (broker/service.py)
        replica.observe_traffic("produced", "t", len(placed), request.ByteSize())
        await replica.commit_offset("g", "t", 0, 2)
        assert value("tidelog_produced_messages_total", {**ident, "topic": "t"}) == 5
        assert value("tidelog_produced_bytes_total", {**ident, "topic": "t"}) == request.ByteSize()
        assert value("tidelog_rpc_duration_seconds_count", {**ident, "method": "Produce"}) == 2
        assert value("tidelog_rpc_errors_total", {**ident, "method": "Produce", "code": "NOT_MASTER"}) == 1
        assert value("tidelog_ack_wait_seconds_count", ident) == 2  # the produce and the commit
        assert value("tidelog_commitlog_fsync_seconds_count", ident) >= 1  # flush: sync
        assert value("tidelog_commitlog_flush_size_bytes_sum", ident) >= 500
        assert value("tidelog_broker_role", {**ident, "role": "master"}) == 1
        assert value("tidelog_broker_role", {**ident, "role": "slave"}) == 0
        assert value("tidelog_broker_epoch", ident) == 1
        assert value("tidelog_commitlog_max_offset", ident) == replica.log.max_offset > 0
        assert value("tidelog_commitlog_confirm_offset", ident) == replica.log.confirm_offset
        assert value("tidelog_sync_state_set_size", ident) == 1
        assert value("tidelog_sync_state_set_changes_total", ident) == 1
        assert value("tidelog_disk_used_bytes", ident) > 0
        # the commit is folded once confirmed, which may come a loop turn after its acknowledgement:
        # wait on the confirm offset's own wake-up (the broker's long poll)
        end = replica.log.max_offset
        confirmed = await replica.long_poll(lambda: (replica.log.confirm_offset >= end,) * 2, 5000)
        assert confirmed, "the commit was never confirmed"
        lag = {**ident, "group": "g", "topic": "t", "queue": "0"}
        assert value("tidelog_consumer_lag_messages", lag) == 3
        status, _, body = respond("GET", "/metrics", metrics.registry, metrics.ready)
        assert (
            status == 200
            and b'tidelog_produced_messages_total{broker_id="1",broker_set="broker-a",topic="t"} 5.0' in body
        )
    finally:
        await metrics.close()
        await replica.close()
        replica.log.close()


def test_retention_counters_are_exported_as_they_grow() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from tidelog.broker.metrics import RetentionCollector

    class Counts:
        deleted_segments = 0
        carried_records = 0
        cut_messages = 0

    counts = Counts()
    registry = CollectorRegistry()
    registry.register(RetentionCollector(lambda: ["broker-a", "1"], counts))
    counts.deleted_segments, counts.carried_records, counts.cut_messages = 3, 7, 11
    text = generate_latest(registry).decode()
    assert 'tidelog_retention_deleted_segments_total{broker_id="1",broker_set="broker-a"} 3.0' in text
    assert 'tidelog_retention_carried_records_total{broker_id="1",broker_set="broker-a"} 7.0' in text
    assert 'tidelog_retention_cut_messages_total{broker_id="1",broker_set="broker-a"} 11.0' in text
