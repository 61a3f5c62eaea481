"""Scenario: Spark jobs against a secure cluster (deploy/secure.yaml: TLS on every port, every call
signed by a user and checked against the grants), with the source's and sink's options `caFile`,
`accessKey` and `secretKey` (spark/plan.py).

A user granted consume on a topic reads exactly what was acknowledged, byte for byte, over TLS; the
same user is refused (PERMISSION_DENIED) on a topic it was not granted, a job without credentials
is refused (UNAUTHENTICATED), and a user granted produce on one topic writes it and nothing else:
what a refused write leaves behind is read back, and is nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, start_cluster, stop_cluster
from tests.client.test_auth import cli, new_users
from tests.spark.conftest import log_contents, produce, rows_by_pos
from tests.spark.test_spark_cluster import assert_rows_equal_sent, messages
from tidelog.client import Client
from tidelog.spark import write

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SECURE = REPO / "deploy" / "secure.yaml"


@pytest.fixture(autouse=True)
def no_cluster_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs here are users': the test session's $TIDE_CLUSTER_SECRET is another cluster's."""
    monkeypatch.delenv("TIDE_CLUSTER_SECRET", raising=False)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("spark-secure"), SECURE)
    try:
        yield c
    finally:
        stop_cluster(c)


def options(c: LocalCluster, creds: dict[str, str] | None) -> dict[str, str]:
    out = {"caFile": str(c.up_doc["ca_file"])}
    if creds is not None:
        out.update(accessKey=creds["access_key"], secretKey=creds["secret_key"])
    return out


def admin_client(c: LocalCluster) -> Client:
    creds = c.up_doc["credentials"]
    return Client(
        c.controllers,
        ca_file=c.up_doc["ca_file"],
        access_key=creds["access_key"],
        secret_key=creds["secret_key"],
        send_timeout=30.0,
    )


def read(spark: Any, c: LocalCluster, topic: str, creds: dict[str, str] | None) -> list[Any]:
    r = spark.read.format("tidelog").option("controllers", c.controllers).option("topic", topic)
    for k, v in {**options(c, creds), "includeHeaders": "true"}.items():
        r = r.option(k, v)
    return list(r.load().collect())


def once_granted(attempt: Callable[[], Any], within_s: float = 20.0) -> Any:
    """`attempt`'s result once the brokers know the new user and grant (their next heartbeat)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return attempt()
        except Exception as exc:  # Spark wraps the source's error in its own exception types
            if time.monotonic() > deadline or not any(
                code in str(exc) for code in ("PERMISSION_DENIED", "UNAUTHENTICATED")
            ):
                raise
            time.sleep(0.5)


def refused(attempt: Callable[[], Any], code: str) -> str:
    """The text of the error `attempt` ends with; it must carry `code`."""
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's wrapper types vary by path
        attempt()
    text = str(info.value)
    assert code in text, text[-2000:]
    return text


def test_spark_reads_and_writes_as_a_permitted_user_only(spark: Any, secured: LocalCluster) -> None:
    cli(secured, "topic", "create", "sp-in", "--queues", "2")
    cli(secured, "topic", "create", "sp-out", "--queues", "2")
    with admin_client(secured) as admin:
        sent = produce(admin, "sp-in", messages(120, seed=21))
    made = new_users(
        secured,
        {"spark-reader": (("topic", "sp-in", "consume"),), "spark-writer": (("topic", "sp-out", "produce"),)},
    )
    reader, writer = made["spark-reader"], made["spark-writer"]

    rows = once_granted(lambda: read(spark, secured, "sp-in", reader))
    assert_rows_equal_sent(rows_by_pos(rows), sent)

    text = refused(lambda: read(spark, secured, "sp-out", reader), "PERMISSION_DENIED")
    # refused where the job plans (the route, or the offsets): either way it names user and topic
    assert "user spark-reader lacks" in text and "on topic sp-out" in text
    refused(lambda: read(spark, secured, "sp-in", None), "UNAUTHENTICATED")

    bodies = [b"w%03d" % i for i in range(60)]
    df = spark.createDataFrame([(b,) for b in bodies], "body binary")
    once_granted(lambda: write(df, "sp-out", secured.controllers, **options(secured, writer)))
    # the reader may not write what it reads, nor the writer where it was not granted
    refused(lambda: write(df, "sp-in", secured.controllers, **options(secured, reader)), "PERMISSION_DENIED")
    refused(lambda: write(df, "sp-in", secured.controllers, **options(secured, writer)), "PERMISSION_DENIED")

    with admin_client(secured) as admin:
        assert sorted(m.body for m in log_contents(admin, "sp-out").values()) == bodies
        kept = log_contents(admin, "sp-in")
    assert sorted(kept) == sorted(sent)  # the refused writes stored nothing
    assert all(kept[p].body == m.body for p, m in sent.items())
