"""Scenario: the JVM data-port reader (`tidelog.spark.read_dataport`, spark/jvm) against a real local
cluster (tide cluster up, one per module) in the tests' SparkSession, which has its jar.

Every check compares it with the Python source (`format("tidelog")`) or with what the producer
was acknowledged: the same rows, column by column and byte for byte; nothing past the planned ends
(which are at most the confirmed offsets); a pruned select; replicas that are down or silent
passed over for the next; and clear errors for a malformed plan, unreachable replicas and a jar
that was never built.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.client.conftest import LocalCluster
from tests.spark.conftest import make_topic, produce, rows_by_pos
from tests.spark.test_spark_cluster import assert_rows_equal_sent, messages, reader
from tidelog.client import Client
from tidelog.errors import ConfigError
from tidelog.localcluster.procs import free_port
from tidelog.spark import dataport, fetch, plan, read_dataport
from tidelog.spark.source import TidelogBatchReader

pytestmark = pytest.mark.slow

TOPIC = "dp"
QUEUES = 3
COUNT = 2400


@pytest.fixture(scope="module")
def sent(cluster: LocalCluster, client: Client) -> dict:
    """The module's topic, produced once: (broker set, queue, offset) -> the message acknowledged there."""
    make_topic(client, TOPIC, QUEUES)
    return produce(client, TOPIC, messages(COUNT, seed=7))


@pytest.fixture
def spark_jvm(spark: Any) -> Any:
    """The tests' session, which must have the reader's jar (`make spark` builds it)."""
    dataport.jar_path()  # a clear failure when the jar was never built
    return spark


def plan_doc(cluster: LocalCluster, **options: str) -> dict:
    opts = {"controllers": cluster.controllers, "topic": TOPIC, **{k.lower(): v for k, v in options.items()}}
    return json.loads(dataport.plan_json(plan.ReadOptions.parse(opts, streaming=False)))


def load_plan(spark: Any, doc: dict) -> Any:
    return spark.read.format(dataport.FORMAT).option("plan", json.dumps(doc)).load()


def as_dicts(rows: dict) -> dict:
    return {pos: r.asDict() for pos, r in rows.items()}


def test_rows_equal_the_python_sources(spark_jvm: Any, cluster: LocalCluster, sent: dict) -> None:
    options = {"includeHeaders": "true", "maxOffsetsPerPartition": "300"}
    python = rows_by_pos(reader(spark_jvm, cluster, TOPIC, **options).collect())
    # Small pulls: several chunks per range, with pulls in flight ahead of the one awaited.
    df = read_dataport(spark_jvm, cluster.controllers, TOPIC, fetchMaxMessages="64", **options)
    jvm = rows_by_pos(df.collect())
    assert len(jvm) == COUNT
    assert_rows_equal_sent(jvm, sent)
    assert as_dicts(jvm) == as_dicts(python)  # every column, bodies and headers byte for byte
    assert df.schema == reader(spark_jvm, cluster, TOPIC, **options).schema
    # The same planning as the Python source: the same ranges, one Spark partition each.
    opts = {"controllers": cluster.controllers, "topic": TOPIC, **{k.lower(): v for k, v in options.items()}}
    py_parts = TidelogBatchReader(opts, df.schema).partitions()
    doc = plan_doc(cluster, **options)
    assert [(p["brokerSet"], p["queue"], p["start"], p["end"]) for p in doc["partitions"]] == [
        (p.broker_set, p.queue, p.start, p.end) for p in py_parts
    ]
    assert df.rdd.getNumPartitions() == len(py_parts) > QUEUES
    # Without headers, and with no read-ahead at all: the same rows.
    plain = rows_by_pos(read_dataport(spark_jvm, cluster.controllers, TOPIC, read_ahead=0).collect())
    assert "headers" not in next(iter(plain.values())).asDict()
    assert as_dicts(plain) == {
        pos: {k: v for k, v in r.items() if k != "headers"} for pos, r in as_dicts(jvm).items()
    }


def test_reads_nothing_past_the_planned_ends(
    spark_jvm: Any, cluster: LocalCluster, client: Client, sent: dict
) -> None:
    view = fetch.run(lambda c: fetch.cluster_view(c, [TOPIC]), cluster.controllers)
    confirmed = {(s.broker_set, s.queue): s.confirmed for s in view.states}
    doc = plan_doc(cluster)
    assert all(p["end"] <= confirmed[(p["brokerSet"], p["queue"])] for p in doc["partitions"])
    df = read_dataport(spark_jvm, cluster.controllers, TOPIC)
    first = rows_by_pos(df.collect())
    # Written after planning: not read by this DataFrame, whose ranges were frozen at planning.
    later = produce(client, TOPIC, messages(90, seed=8, prefix="late"))
    assert sorted(rows_by_pos(df.collect())) == sorted(first) == sorted(sent)
    # An end below what the queue holds: offsets up to it, none at or past it.
    (bs, q) = sorted(confirmed)[0]
    ending = json.dumps({TOPIC: {f"{bs}:{q}": 5}})
    cut = rows_by_pos(read_dataport(spark_jvm, cluster.controllers, TOPIC, endingOffsets=ending).collect())
    assert sorted(off for b, qq, off in cut if (b, qq) == (bs, q)) == [0, 1, 2, 3, 4]
    # A new read plans again and sees everything.
    assert sorted(rows_by_pos(read_dataport(spark_jvm, cluster.controllers, TOPIC).collect())) == sorted(
        sent | later
    )


def canonical(row: Any) -> tuple:
    """A row as a sortable tuple (a map as its sorted items, None before any value)."""
    return tuple(
        (1, tuple(sorted(v.items()))) if isinstance(v, dict) else (0, ()) if v is None else (1, v)
        for v in row
    )


def test_a_pruned_select_builds_only_its_columns(spark_jvm: Any, cluster: LocalCluster, sent: dict) -> None:
    df = read_dataport(spark_jvm, cluster.controllers, TOPIC, includeHeaders="true")
    python = reader(spark_jvm, cluster, TOPIC, includeHeaders="true")
    for columns in (["offset", "body"], ["headers", "queue"], ["key", "timestamp", "tags"]):
        got = df.select(*columns)
        assert got.schema.names == columns
        plan_text = got._jdf.queryExecution().executedPlan().toString()
        scan = next(line for line in plan_text.splitlines() if "BatchScan" in line)
        assert "tidelog data-port scan" in scan
        assert all(f"{c}#" in scan for c in columns) and "topic#" not in scan, scan  # the scan's output
        assert sorted(map(canonical, got.collect())) == sorted(
            map(canonical, python.select(*columns).collect())
        )
    assert df.count() == python.count()


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that accepts connections and never answers (a replica gone silent)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def test_a_replica_down_or_silent_is_passed_over(
    spark_jvm: Any, cluster: LocalCluster, sent: dict, silent: str
) -> None:
    truth = rows_by_pos(read_dataport(spark_jvm, cluster.controllers, TOPIC).collect())
    down = f"127.0.0.1:{free_port()}"  # nothing listens there: connections are refused
    doc = plan_doc(cluster, maxOffsetsPerPartition="400")
    assert all(len(p["replicas"]) == 2 for p in doc["partitions"]), "a broker set of two replicas"
    for p in doc["partitions"]:
        p["replicas"] = [down, p["replicas"][0], down, p["replicas"][1]]
    assert as_dicts(rows_by_pos(load_plan(spark_jvm, doc).collect())) == as_dicts(truth)
    # A replica that never answers costs one pull's timeout (its wait plus 5 s), then the next serves.
    one = doc["partitions"][0]
    one["replicas"] = [silent, *one["replicas"][1:]]
    doc["partitions"] = [one]
    got = rows_by_pos(load_plan(spark_jvm, doc).collect())
    assert sorted(got) == [(one["brokerSet"], one["queue"], off) for off in range(one["start"], one["end"])]
    assert all(got[p] == truth[p] for p in got)


def test_unreachable_replicas_fail_the_read_in_its_timeout(
    spark_jvm: Any, cluster: LocalCluster, sent: dict
) -> None:
    doc = plan_doc(cluster, readTimeout="2")
    doc["partitions"] = doc["partitions"][:1]
    doc["partitions"][0]["replicas"] = [f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    with pytest.raises(Exception, match="could not read offsets .* within 2.0 s") as err:
        load_plan(spark_jvm, doc).collect()
    assert time.monotonic() - started < 30
    assert "cannot reach the data port" in str(err.value)


@pytest.mark.parametrize(
    ("plan_text", "message"),
    [
        ("{not json", "option plan is not valid JSON"),
        ("[]", "option plan must be a JSON object"),
        (None, "option plan is required"),
        ('{"version": 9}', "plan version 9 is not 1"),
    ],
)
def test_a_malformed_plan_is_a_clear_error(spark_jvm: Any, plan_text: str | None, message: str) -> None:
    r = spark_jvm.read.format(dataport.FORMAT)
    if plan_text is not None:
        r = r.option("plan", plan_text)
    with pytest.raises(Exception, match=message):
        r.load()


def test_a_malformed_partition_is_named(spark_jvm: Any, cluster: LocalCluster, sent: dict) -> None:
    doc = plan_doc(cluster)
    doc["partitions"][1]["replicas"] = ["no-port"]
    with pytest.raises(Exception, match=r"plan.partitions\[1\].replicas\[0\] is not a host:port address"):
        load_plan(spark_jvm, doc)
    doc = plan_doc(cluster)
    doc["partitions"][0]["end"] = -1
    with pytest.raises(Exception, match=r"plan.partitions\[0\].end must be in 0\.\."):
        load_plan(spark_jvm, doc)


def test_an_unknown_column_is_a_clear_error(spark_jvm: Any, cluster: LocalCluster, sent: dict) -> None:
    df = read_dataport(spark_jvm, cluster.controllers, TOPIC)
    with pytest.raises(Exception, match="nope"):
        df.select("nope").collect()
    with pytest.raises(Exception, match="headers"):
        df.select("headers").collect()  # only with includeHeaders, as the Python source


def test_a_jar_never_built_is_a_clear_error(
    spark_jvm: Any, cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(dataport, "JAR", tmp_path / "tidelog-spark.jar")
    with pytest.raises(ConfigError, match="is not built") as err:
        read_dataport(spark_jvm, cluster.controllers, TOPIC)
    assert "make spark" in str(err.value)
    with pytest.raises(ConfigError, match="make spark"):
        dataport.jar_path()
