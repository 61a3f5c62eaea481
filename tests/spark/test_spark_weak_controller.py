"""A Spark batch read started while no controller answers (docs/ARCHITECTURE.md §3.5, §7.5): with a
bootstrap list that names the brokers, the source plans from a broker's view and reads every
confirmed message, byte for byte."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from tests.client.conftest import LocalCluster
from tests.spark.conftest import produce
from tidelog.client import Client, OutMessage
from tidelog.errors import TidelogError
from tidelog.localcluster import wait_until
from tidelog.localcluster.cluster import bootstrap
from tidelog.spark import fetch

pytestmark = pytest.mark.slow


def test_a_batch_read_started_during_a_controller_outage_reads_everything(
    spark: Any, cluster_factory: Callable[..., LocalCluster]
) -> None:
    cluster = cluster_factory(name="sparkaway")
    bodies = [f"{i:05d}".encode() + bytes([i % 251]) * 300 for i in range(2000)]
    with Client(cluster.controllers) as client:
        client.admin().create_topic("away", queues=4)
        produce(client, "away", [OutMessage(b) for b in bodies])
    addresses = ",".join(bootstrap(cluster.state()))
    brokers = ",".join(p["address"] for p in cluster.state()["processes"] if p["kind"] == "broker")

    def brokers_know_the_topic() -> bool:
        try:  # the brokers alone, as the read will find them: their views hold the new topic
            return bool(fetch.run(lambda c: fetch.cluster_view(c, ["away"]), brokers).states)
        except TidelogError:
            return False

    wait_until(brokers_know_the_topic, 15, what="the brokers' views to hold the topic")
    controllers = [p["pid"] for p in cluster.state()["processes"] if p["kind"] == "controller"]
    assert controllers
    for pid in controllers:
        os.kill(pid, signal.SIGSTOP)
    try:
        rows = (
            spark.read.format("tidelog")
            .option("controllers", addresses)
            .option("topic", "away")
            .load()
            .select("body")
            .collect()
        )
    finally:
        for pid in controllers:
            os.kill(pid, signal.SIGCONT)
    assert sorted(bytes(r.body) for r in rows) == sorted(bodies)
