"""Scenario: Spark jobs read and write topics of a real local cluster (tide cluster up: separate
processes on loopback) through `format("tidelog")`, in one local[2] SparkSession.

Every check compares what Spark returned with what the producer was acknowledged, position by
position ((broker set, queue, offset)), bodies byte for byte, or with the log as the plain
client reads it.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LocalCluster
from tests.spark.conftest import log_contents, make_topic, produce, rows_by_pos
from tidelog.client import Client, OutMessage
from tidelog.errors import TopicNotFoundError
from tidelog.spark import fetch, write

pytestmark = pytest.mark.slow


def messages(n: int, seed: int, prefix: str = "") -> list[OutMessage]:
    """Distinct bodies of varied size (empty, binary, up to 2 KiB), some keyed, some with tags and headers."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        body = f"{prefix}{i}:".encode() + rnd.randbytes(rnd.choice([0, 1, 17, 300, 2048]))
        key = f"k{rnd.randrange(7)}" if i % 3 else None
        tags = "red" if i % 4 == 0 else None
        headers = {"seq": str(i), "src": "test"} if i % 2 else None
        out.append(OutMessage(body, key, tags, headers))
    return out


def reader(spark: Any, cluster: LocalCluster, topic: str, **options: str) -> Any:
    r = spark.read.format("tidelog").option("controllers", cluster.controllers).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def assert_rows_equal_sent(rows: dict, sent: dict, headers: bool = True) -> None:
    assert sorted(rows) == sorted(sent)
    for pos, m in sent.items():
        r = rows[pos]
        assert r["body"] == m.body, pos
        assert (r["key"], r["tags"]) == (m.key, m.tags), pos
        if headers:
            assert (r["headers"] or {}) == (dict(m.properties) if m.properties else {}), pos


def test_batch_read_returns_exactly_the_acknowledged_messages(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    make_topic(client, "batch", 3)
    sent = produce(client, "batch", messages(300, seed=1))
    df = reader(spark, cluster, "batch", includeHeaders="true", maxOffsetsPerPartition="40")
    rows = rows_by_pos(df.collect())
    assert_rows_equal_sent(rows, sent)
    per_queue = collections.Counter((bs, q) for bs, q, _ in sent)
    # Big queues are split: one partition per 40 offsets of each queue.
    assert df.rdd.getNumPartitions() == sum(math.ceil(n / 40) for n in per_queue.values())
    assert {r["topic"] for r in rows.values()} == {"batch"}
    # The same job with one Python tuple per row returns the same rows (the bench compares speed).
    tuples = rows_by_pos(reader(spark, cluster, "batch", includeHeaders="true", rowFormat="tuples").collect())
    assert tuples == rows


def test_messages_produced_after_planning_are_not_read(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    make_topic(client, "after", 2)
    first = produce(client, "after", messages(60, seed=2, prefix="a"))
    df = reader(spark, cluster, "after")
    planned = rows_by_pos(df.collect())  # the first action plans: ranges end at the confirmed offsets now
    later = produce(client, "after", messages(40, seed=3, prefix="b"))
    again = rows_by_pos(df.collect())
    assert sorted(planned) == sorted(again) == sorted(first)
    assert all(again[p]["body"] == first[p].body for p in first)
    # A new load plans again and sees everything.
    assert sorted(rows_by_pos(reader(spark, cluster, "after").collect())) == sorted(first | later)


def test_batch_read_while_producing_is_a_confirmed_prefix_of_each_queue(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    make_topic(client, "busy", 2)
    acked: dict = {}
    acked.update(produce(client, "busy", messages(50, seed=4, prefix="pre")))
    stop = threading.Event()

    def keep_producing() -> None:
        with Client(cluster.controllers) as c:
            i = 0
            while not stop.is_set():
                acked.update(produce(c, "busy", messages(20, seed=100 + i, prefix=f"live{i}-")))
                i += 1

    t = threading.Thread(target=keep_producing)
    t.start()
    try:
        before = len(acked)
        rows = rows_by_pos(reader(spark, cluster, "busy").collect())
    finally:
        stop.set()
        t.join(60)
    truth = log_contents(client, "busy")
    assert len(rows) >= before  # everything acknowledged before planning is confirmed, so read
    for bs, q in {(bs, q) for bs, q, _ in truth}:
        got = sorted(off for b, qq, off in rows if (b, qq) == (bs, q))
        assert got == list(range(len(got))), "each queue is read from its start, without a gap"
        for off in got:
            assert rows[(bs, q, off)]["body"] == truth[(bs, q, off)].body


def test_starting_and_ending_offsets_select_exact_ranges(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    make_topic(client, "ranges", 3)
    sent = produce(client, "ranges", messages(150, seed=5))
    sizes = collections.Counter((bs, q) for bs, q, _ in sent)
    assert all(n >= 10 for n in sizes.values())
    starting = '{"ranges": {"broker-a:0": 5, "broker-a:1": -2}}'
    ending = '{"ranges": {"broker-a:0": 9, "broker-a:1": 3, "broker-a:2": -1}}'
    rows = rows_by_pos(
        reader(spark, cluster, "ranges", startingOffsets=starting, endingOffsets=ending).collect()
    )
    want = {p for p in sent if (p[1] == 0 and 5 <= p[2] < 9) or (p[1] == 1 and p[2] < 3) or p[1] == 2}
    assert sorted(rows) == sorted(want)
    # A narrower schema is honoured: only those columns are built.
    narrow = (
        spark.read.schema("queue int, offset long, body binary")
        .format("tidelog")
        .option("controllers", cluster.controllers)
        .option("topic", "ranges")
        .load()
        .collect()
    )
    assert sorted((r["queue"], r["offset"], r["body"]) for r in narrow) == sorted(
        (q, off, m.body) for (_, q, off), m in sent.items()
    )


def test_stream_three_micro_batches_then_restart_reads_each_message_once(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    make_topic(client, "stream", 3)
    sent = produce(client, "stream", messages(30, seed=6, prefix="one"))
    batches: dict[int, list] = {}

    def collect(df: Any, batch_id: int) -> None:
        # Keyed by batch id: a batch Spark runs again replaces itself (an idempotent sink).
        batches[batch_id] = df.collect()

    def run(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.format("tidelog")
            .option("controllers", cluster.controllers)
            .option("topic", "stream")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "10")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(**trigger)
            .start()
        )

    q = run({"availableNow": True})
    assert q.awaitTermination(120), "the availableNow query did not finish"
    assert q.exception() is None
    assert sorted(batches) == [0, 1, 2], "30 messages at 10 per trigger are three micro-batches"
    assert [len(batches[b]) for b in sorted(batches)] == [10, 10, 10]

    more = produce(client, "stream", messages(25, seed=7, prefix="two"))
    q = run({"processingTime": "0 seconds"})  # restarted from the checkpoint, then stopped
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert min(b for b in batches if b > 2) == 3, (
        "the restarted query continues after the last committed batch"
    )
    evenmore = produce(client, "stream", messages(12, seed=8, prefix="three"))
    q = run({"availableNow": True})
    assert q.awaitTermination(120)
    rows = rows_by_pos([r for b in sorted(batches) for r in batches[b]])  # fails on any duplicate
    assert_rows_equal_sent(rows, sent | more | evenmore, headers=False)
    assert all(len(batches[b]) <= 10 for b in batches)


def test_sink_round_trips_a_dataframe(spark: Any, cluster: LocalCluster, client: Client) -> None:
    make_topic(client, "sink", 2)
    rnd = random.Random(9)
    data = [
        (
            f"k{i % 5}" if i % 3 else None,
            "blue" if i % 2 else None,
            rnd.randbytes(rnd.randrange(0, 500)),
            {"n": str(i)} if i % 4 else None,
        )
        for i in range(120)
    ]
    df = spark.createDataFrame(data, "key string, tags string, body binary, headers map<string,string>")
    write(df, "sink", cluster.controllers)
    back = reader(spark, cluster, "sink", includeHeaders="true").collect()
    assert collections.Counter(
        (r["key"], r["tags"], r["body"], tuple(sorted((r["headers"] or {}).items()))) for r in back
    ) == collections.Counter((k, t, b, tuple(sorted((h or {}).items()))) for k, t, b, h in data)
    # Messages of one key from one task keep their order.
    parts = df.rdd.getNumPartitions()
    if parts == 1:
        for key in {k for k, *_ in data if k}:
            got = [r["body"] for r in sorted(back, key=lambda r: r["offset"]) if r["key"] == key]
            assert got == [b for k, _, b, _ in data if k == key]
    # String bodies are sent as UTF-8.
    write(spark.createDataFrame([("héllo",), ("wörld",)], "body string"), "sink", cluster.controllers)
    assert {r["body"] for r in reader(spark, cluster, "sink").collect()} >= {
        "héllo".encode(),
        "wörld".encode(),
    }


def test_streaming_sink_copies_a_topic(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    make_topic(client, "copy-from", 2)
    make_topic(client, "copy-to", 3)
    sent = produce(client, "copy-from", messages(80, seed=10))
    q = (
        spark.readStream.format("tidelog")
        .option("controllers", cluster.controllers)
        .option("topic", "copy-from")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("tidelog")
        .option("controllers", cluster.controllers)
        .option("topic", "copy-to")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert q.exception() is None
    copied = log_contents(client, "copy-to")
    assert collections.Counter((m.key, m.tags, m.body) for m in copied.values()) == collections.Counter(
        (m.key, m.tags, m.body) for m in sent.values()
    )


def test_an_unknown_topic_fails_planning_at_once(cluster: LocalCluster) -> None:
    start = time.monotonic()
    with pytest.raises(TopicNotFoundError):
        fetch.run(lambda c: fetch.cluster_view(c, ["no-such-topic"]), cluster.controllers)
    assert time.monotonic() - start < 10, (
        "the controller's answer is final: no retrying for the whole timeout"
    )
