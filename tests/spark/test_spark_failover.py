"""Scenario: replicas die under Spark reads (each test on its own cluster, processes killed by pid).

- A slave killed in the middle of a range read: the read goes on from the same offset on the
  master and returns the same bytes as an undisturbed read.
- The master killed (SIGKILL) while a streaming query runs micro-batches every 0.5 s and a
  producer keeps writing: the query sees no gap and no duplicate, and ends up with exactly the
  log as the surviving replica holds it, which includes every acknowledged message.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LocalCluster
from tests.spark.conftest import log_contents, produce, rows_by_pos
from tidelog.client import Client, OutMessage
from tidelog.client.aio import AsyncClient
from tidelog.dataport_frames import PullCall
from tidelog.localcluster import wait_until
from tidelog.proto import broker_pb2 as bpb
from tidelog.spark import fetch

pytestmark = pytest.mark.slow


def pid_of(cluster: LocalCluster, address: str) -> int:
    return next(p["pid"] for p in cluster.state()["processes"] if p.get("address") == address)


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_slave_killed_mid_read_is_retried_on_the_master_with_identical_bytes(
    spark: Any, cluster_factory: Callable[..., LocalCluster]
) -> None:
    cluster = cluster_factory(name="midread")
    with Client(cluster.controllers) as client:
        client.admin().create_topic("midread", queues=1)
        produce(
            client,
            "midread",
            [OutMessage(f"{i:06d}".encode() + bytes([i % 251]) * 1000) for i in range(3000)],
        )
        truth = log_contents(client, "midread")
    assert len(truth) == 3000
    view = fetch.run(lambda c: fetch.cluster_view(c, ["midread"]), cluster.controllers)
    (state,) = view.states
    replicas = view.replicas[("midread", "broker-a")]
    assert len(replicas) == 2 and state.confirmed == 3000

    async def slave_confirmed(client: AsyncClient) -> int:
        reply = await client.call_broker(
            replicas[0], "GetOffsets", bpb.GetOffsetsRequest(topic="midread", queue=0)
        )
        return int(reply.offsets.confirmed)

    # The slave learns the confirmed offset from the master's next push: wait for it, so that
    # the first pull tests the preference for slaves, not that race.
    wait_until(
        lambda: fetch.run(slave_confirmed, cluster.controllers) == 3000, 10, what="the slave's confirm"
    )

    async def read_with_a_kill(client: AsyncClient) -> tuple[list[Any], list[tuple[str, int, int]]]:
        # Open the slave's data connection first (a Status call, then a connect): on a loaded
        # machine that can take longer than the hedge waits before asking the next replica.
        await client.pull_records(replicas[0], PullCall("midread", 0, 0, 1, 0, 0), 5.0)
        reader = fetch.RangeReader(
            client, "midread", "broker-a", 0, 0, state.confirmed, replicas, max_messages=500
        )
        got = list(await reader.next_chunk())
        assert reader.served_by == [(replicas[0], 0, 500)], "reads prefer the slave"
        kill9(pid_of(cluster, replicas[0]))  # the slave dies between two pulls of the same range
        while chunk := await reader.next_chunk():
            got.extend(chunk)
        return got, reader.served_by

    got, served = fetch.run(read_with_a_kill, cluster.controllers)
    assert {a for a, _, _ in served} == set(replicas), "the rest of the range came from the master"
    assert [m.offset for m in got] == list(range(3000))
    assert [m.body for m in got] == [truth[("broker-a", 0, i)].body for i in range(3000)]
    # Spark, planning now, still lists the dead slave first; its tasks fall back to the master.
    df = (
        spark.read.format("tidelog")
        .option("controllers", cluster.controllers)
        .option("topic", "midread")
        .option("maxOffsetsPerPartition", "1000")
        .load()
    )
    rows = rows_by_pos(df.collect())
    assert sorted(rows) == sorted(truth)
    assert all(rows[p]["body"] == truth[p].body for p in truth)


def _start_producer(
    client: Client, acked: dict, stop: threading.Event, errors: list[BaseException]
) -> threading.Thread:
    """A started thread producing batches of 20 messages until `stop`, every ack into `acked`."""

    def keep_producing() -> None:
        i = 0
        try:
            while not stop.is_set():
                acked.update(
                    produce(client, "failover", [OutMessage(f"m{i}-{j}".encode()) for j in range(20)])
                )
                i += 1
                time.sleep(0.05)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    producer = threading.Thread(target=keep_producing)
    producer.start()
    return producer


def _start_query(spark: Any, cluster: LocalCluster, tmp_path: Path, batches: dict[int, list]) -> Any:
    """A streaming query from the earliest offsets, a micro-batch every 0.5 s, each collected into `batches`."""

    def collect(df: Any, batch_id: int) -> None:
        batches[batch_id] = df.collect()

    return (
        spark.readStream.format("tidelog")
        .option("controllers", cluster.controllers)
        .option("topic", "failover")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _seen(batches: dict[int, list]) -> int:
    return sum(len(b) for b in list(batches.values()))


def _wait_for_two_batches_with_data(batches: dict[int, list], q: Any, deadline: float) -> None:
    """The query runs: two micro-batches with data before the kill."""
    while len([b for b in batches.values() if b]) < 2:
        assert time.monotonic() < deadline and q.isActive, f"no two batches with data: {q.exception()}"
        time.sleep(0.1)


def _kill_master_and_see_more_batches(
    client: Client, cluster: LocalCluster, batches: dict[int, list], q: Any, deadline: float
) -> None:
    """SIGKILL the master; the query keeps going: more batches with data after the kill."""
    master = client.runner.run(client.aio.route("failover", refresh=True)).broker_sets[0].master_address
    batches_before_kill = max(batches)
    kill9(pid_of(cluster, master))
    # The query keeps going: more batches with data after the kill.
    while len([b for b, rows in batches.items() if b > batches_before_kill + 1 and rows]) < 2:
        assert time.monotonic() < deadline + 60 and q.isActive, f"stalled after the kill: {q.exception()}"
        time.sleep(0.2)


def _stop_producing_and_catch_up(
    client: Client,
    producer: threading.Thread,
    stop: threading.Event,
    errors: list[BaseException],
    batches: dict[int, list],
    q: Any,
    deadline: float,
) -> dict:
    """Stop the producer (it must not have failed); the query catches up with the log. Returns the log."""
    stop.set()
    producer.join(90)
    assert not errors, f"the producer failed: {errors}"
    truth = log_contents(client, "failover")
    while _seen(batches) < len(truth):
        assert time.monotonic() < deadline + 120 and q.isActive, (
            f"caught up to {_seen(batches)} of {len(truth)}"
        )
        time.sleep(0.2)
    return truth


def _assert_the_query_read_the_log(batches: dict[int, list], truth: dict, acked: dict) -> None:
    """No gap, no duplicate, the same bytes as the log, and every acknowledged message in it."""
    rows = rows_by_pos([r for b in sorted(batches) for r in batches[b]])  # fails on a duplicate
    assert sorted(rows) == sorted(truth), "every queue read from 0 to its end, without a gap"
    assert all(rows[p]["body"] == truth[p].body for p in truth)
    assert set(acked) <= set(truth), "an acknowledged message was lost"
    assert all(truth[p].body == m.body for p, m in acked.items())


def test_master_killed_between_micro_batches_gives_no_gap_and_no_duplicate(
    spark: Any, cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(name="failover")
    client = Client(cluster.controllers, send_timeout=60.0)
    try:
        client.admin().create_topic("failover", queues=2)
        acked: dict = {}
        stop = threading.Event()
        errors: list[BaseException] = []
        batches: dict[int, list] = {}
        producer = _start_producer(client, acked, stop, errors)
        q = _start_query(spark, cluster, tmp_path, batches)
        try:
            deadline = time.monotonic() + 90
            _wait_for_two_batches_with_data(batches, q, deadline)
            _kill_master_and_see_more_batches(client, cluster, batches, q, deadline)
            truth = _stop_producing_and_catch_up(client, producer, stop, errors, batches, q, deadline)
        finally:
            stop.set()
            q.stop()
            producer.join(90)
        _assert_the_query_read_the_log(batches, truth, acked)
    finally:
        client.close()
