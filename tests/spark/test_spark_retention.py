"""failOnDataLoss end to end (spark/plan.py `check_start`, broker/retention.py): a cluster from a
topology whose `broker:` section turns retention on (64 KiB segments, 3 s) deletes the start of
a topic while it runs; a Spark batch read asking for offset 0 then fails naming retention, and
with failOnDataLoss=false it skips to what is kept and reads it whole. The JVM data-port reader
(spark/dataport.py) makes the same decision when it meets the deletion while reading a range
planned before it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster
from tests.spark.conftest import produce
from tidelog.client import Client, OutMessage
from tidelog.spark import dataport, plan

pytestmark = pytest.mark.slow

TOPIC = "kept"


def _topology(tmp_path: Path) -> Path:
    doc = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    doc["broker"].update(segment_bytes=64 << 10, retention_ms=3000, retention_check_interval_ms=300)
    path = tmp_path / "retention.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _read(spark: Any, cluster: LocalCluster, **options: str) -> list[Any]:
    r = spark.read.format("tidelog").option("controllers", cluster.controllers).option("topic", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return list(r.load().collect())


def test_fail_on_data_loss_through_spark(
    spark: Any, cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(topology=_topology(tmp_path), name="retention")
    with Client(cluster.controllers) as client:
        client.admin().create_topic(TOPIC, queues=1)
        produce(client, TOPIC, [OutMessage(b"%06d" % i + b"x" * 1000) for i in range(3000)])
        deadline = time.monotonic() + 30
        while client.admin().describe_topic(TOPIC)[0]["min"] == 0:
            assert time.monotonic() < deadline, "retention did not move the queue's min offset"
            time.sleep(0.3)
        (queue,) = client.admin().describe_topic(TOPIC)
    start = json.dumps({TOPIC: {"broker-a:0": 0}})
    with pytest.raises(Exception, match="below retention"):
        _read(spark, cluster, startingOffsets=start)
    rows = _read(spark, cluster, startingOffsets=start, failOnDataLoss="false")
    offsets = sorted(r["offset"] for r in rows)
    assert offsets, "nothing read after skipping ahead"
    assert offsets[0] >= queue["min"] > 0
    assert offsets == list(range(offsets[0], queue["confirmed"]))  # whole from where it starts
    assert all(r["body"][:6] == b"%06d" % r["offset"] for r in rows)

    # A range planned from 0 (as before a deletion) read by the JVM reader: the replica answers
    # OFFSET_BELOW_RETENTION, and the reader fails or skips to the replica's minimum.
    opts = plan.ReadOptions.parse({"controllers": cluster.controllers, "topic": TOPIC}, streaming=False)
    doc = json.loads(dataport.plan_json(opts))
    (part,) = doc["partitions"]
    part["start"] = 0

    def jvm_read(fail_on_data_loss: bool) -> list[Any]:
        doc["failOnDataLoss"] = fail_on_data_loss
        return list(spark.read.format(dataport.FORMAT).option("plan", json.dumps(doc)).load().collect())

    with pytest.raises(Exception, match="start offset 0 is below the log's minimum offset"):
        jvm_read(True)
    skipped = sorted(r["offset"] for r in jvm_read(False))
    assert skipped[0] >= queue["min"] > 0
    assert skipped == list(range(skipped[0], part["end"]))
