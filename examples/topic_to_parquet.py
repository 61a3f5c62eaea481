"""Batch job: aggregate a topic into Parquet.

Reads every confirmed message of a topic once (what a failover could take back is never read)
and writes one row per (key, hour) with the message count, body bytes and first/last offsets
per queue span, as a Parquet dataset partitioned by hour.

    .venv/bin/python examples/topic_to_parquet.py --controllers 127.0.0.1:9701 --topic orders --out /tmp/orders-by-key

Needs the `spark` extra (`make spark`, or `pip install 'tidelog[spark]'`) and Java 17 or 21.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    from tidelog.spark import register
except ModuleNotFoundError as exc:
    if not (exc.name or "").startswith("pyspark"):
        raise
    # a bare ModuleNotFoundError told a newcomer nothing about `make spark`
    raise SystemExit(
        "error: this example needs PySpark, which is not installed: run `make spark` first "
        "(it installs the spark extra into .venv, and Java 17 when missing)"
    ) from None


def aggregate(spark: SparkSession, controllers: str, topic: str) -> DataFrame:
    """Per (hour, key): messages, body bytes, and when the first and last were stored."""
    messages = (
        spark.read.format("tidelog")
        .option("controllers", controllers)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return (
        messages.withColumn("hour", F.date_trunc("hour", "timestamp"))
        .withColumn("key", F.coalesce("key", F.lit("(none)")))
        .groupBy("hour", "key")
        .agg(
            F.count("*").alias("messages"),
            F.sum(F.length("body")).alias("body_bytes"),
            F.min("timestamp").alias("first_stored"),
            F.max("timestamp").alias("last_stored"),
        )
    )


def run(spark: SparkSession, controllers: str, topic: str, out: str) -> Any:
    result = aggregate(spark, controllers, topic)
    result.write.mode("overwrite").partitionBy("hour").parquet(out)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--controllers", default=os.environ.get("TIDE_CONTROLLERS", ""), help="host:port[,...]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True, help="Parquet directory (overwritten)")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.appName("tidelog-topic-to-parquet")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    register(spark)
    try:
        run(spark, args.controllers, args.topic, args.out)
        spark.read.parquet(args.out).orderBy("hour", F.desc("messages")).show(20, truncate=False)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
