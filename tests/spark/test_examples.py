"""The jobs in examples/ run against a real cluster and compute what the producer sent.

Each example is imported from its file and run in the shared SparkSession (starting it as a
script would start a second JVM).
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.client.conftest import LocalCluster
from tests.spark.conftest import REPO, make_topic, produce
from tidelog.client import Client, OutMessage

pytestmark = pytest.mark.slow


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keyed(n: int, prefix: str) -> list[OutMessage]:
    return [OutMessage(f"{prefix}{i}".encode() * 3, key=f"user-{i % 6}" if i % 5 else None) for i in range(n)]


def key_counts(sent: list[OutMessage]) -> dict[str, int]:
    return dict(collections.Counter(m.key or "(none)" for m in sent))


def test_batch_example_aggregates_a_topic_into_parquet(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    make_topic(client, "ex-batch", 2)
    sent = keyed(150, "b")
    produce(client, "ex-batch", sent)
    example("topic_to_parquet").run(spark, cluster.controllers, "ex-batch", str(tmp_path / "out"))
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    got: dict[str, int] = collections.Counter()
    for r in rows:
        got[r["key"]] += r["messages"]
    assert dict(got) == key_counts(sent)
    assert sum(r["body_bytes"] for r in rows) == sum(len(m.body) for m in sent)


def test_streaming_example_keeps_exact_counts_across_restarts(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    make_topic(client, "ex-stream", 2)
    ex = example("key_counts_stream")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "counts")

    def run_once() -> dict[str, int]:
        q = ex.start(
            spark, cluster.controllers, "ex-stream", ckpt, out, available_now=True, max_per_trigger=40
        )
        assert q.awaitTermination(120)
        assert q.exception() is None
        return {r["key"]: r["messages"] for r in spark.read.parquet(out).collect()}

    first = keyed(100, "x")
    produce(client, "ex-stream", first)
    assert run_once() == key_counts(first)
    second = keyed(70, "y")
    produce(client, "ex-stream", second)
    assert run_once() == key_counts(first + second)
