"""One SparkSession for every Spark test, and helpers to produce to and read from a real cluster.

The session is `local[2]` with the UI off and every listener on 127.0.0.1; starting it costs
about 10 s on two cores, so there is one per pytest process. Spark's Python workers are separate
processes started from the JVM: they must run this interpreter (PYSPARK_PYTHON) and find the
repository's modules (PYTHONPATH), both set before the session starts.

Clusters come from tests/client/conftest.py (`tide cluster up`, every process stopped by pid).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client import conftest as client_conftest
from tests.client.conftest import LocalCluster
from tidelog.client import Client, ConsumedMessage, OutMessage, Receipt

REPO = Path(__file__).resolve().parents[2]

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)

# The cluster fixtures (and the hook that adds cluster logs to a failed test's report).
cluster = client_conftest.cluster
cluster_factory = client_conftest.cluster_factory
pytest_runtest_makereport = client_conftest.pytest_runtest_makereport

Pos = tuple[str, int, int]  # (broker set, queue, offset)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if shutil.which("java") is None:
        pytest.fail("the Spark tests need Java 17 or 21 on PATH: `make test` installs it (as root on Debian)")
    from pyspark.sql import SparkSession

    from tidelog.spark import dataport, register

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = SparkSession.builder
    if dataport.JAR.is_file():
        # The JVM data-port reader (`make spark` builds it); its tests fail, saying so, without it.
        builder = dataport.configure(builder)
    session = (
        builder.master("local[2]")
        .appName("tidelog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        # The tests' jobs are small and short: the JIT's optimising tier (C2) and the parallel
        # collector's threads cost more CPU than they win back. With the quick tier and the serial
        # collector the session's JVM took 23 s of CPU over tests/spark instead of 52 s (and the
        # modules 100 s instead of 113 s), on a suite that is CPU-bound.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        # A stopped query must not wait forever for a task stuck on a dead broker.
        .config("spark.sql.streaming.stopTimeout", "60s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=30.0) as c:
        yield c


def make_topic(client: Client, topic: str, queues: int) -> None:
    client.admin().create_topic(topic, queues=queues)


def produce(client: Client, topic: str, messages: list[OutMessage]) -> dict[Pos, OutMessage]:
    """Send and return what was acknowledged where: (broker set, queue, offset) -> message."""
    out: dict[Pos, OutMessage] = {}
    producer = client.producer()
    for i in range(0, len(messages), 200):
        chunk = messages[i : i + 200]
        receipts: list[Receipt] = producer.send_batch(topic, chunk)
        for r, m in zip(receipts, chunk, strict=True):
            out[(r.broker_set, r.queue, r.queue_offset)] = m
    return out


def log_contents(client: Client, topic: str, timeout: float = 30.0) -> dict[Pos, ConsumedMessage]:
    """Every confirmed message of `topic`, read with the client (not Spark): the truth to compare to."""
    out: dict[Pos, ConsumedMessage] = {}
    for q in client.admin().describe_topic(topic):
        reader = client.reader(topic, q["queue"], q["min"], broker_set=q["broker_set"])
        deadline = time.monotonic() + timeout
        while True:
            msgs = reader.read(max_messages=1000)
            for m in msgs:
                out[(m.broker_set, m.queue, m.offset)] = m
            if not msgs or time.monotonic() > deadline:
                break
    return out


def rows_by_pos(rows: list) -> dict[Pos, object]:
    """Spark rows keyed by position; fails on a position seen twice (a duplicate)."""
    out: dict[Pos, object] = {}
    for r in rows:
        pos = (r["broker_set"], r["queue"], r["offset"])
        assert pos not in out, f"position {pos} read twice"
        out[pos] = r
    return out
