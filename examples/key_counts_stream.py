"""Streaming job: keep a running count of messages per key.

Reads a topic as a stream (each micro-batch ends at the queues' confirmed offsets) and keeps,
per key, the number of messages and the last time one was stored. The counts are Spark state in
the checkpoint; after every micro-batch the whole table is written to a Parquet directory
(replaced atomically enough for a dashboard: written beside it, then renamed). Stop it with
Ctrl-C and start it again with the same --checkpoint: it goes on where it stopped, counting
every message exactly once.

    .venv/bin/python examples/key_counts_stream.py --controllers 127.0.0.1:9701 --topic orders \
        --checkpoint /tmp/key-counts-ckpt --out /tmp/key-counts
    .venv/bin/python examples/key_counts_stream.py ... --available-now   # process what is there, then exit

Needs the `spark` extra (`make spark`, or `pip install 'tidelog[spark]'`) and Java 17 or 21.
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQuery

    from tidelog.spark import register
except ModuleNotFoundError as exc:
    if not (exc.name or "").startswith("pyspark"):
        raise
    # a bare ModuleNotFoundError told a newcomer nothing about `make spark`
    raise SystemExit(
        "error: this example needs PySpark, which is not installed: run `make spark` first "
        "(it installs the spark extra into .venv, and Java 17 when missing)"
    ) from None


def counts(
    spark: SparkSession, controllers: str, topic: str, *, max_per_trigger: int | None = None
) -> DataFrame:
    reader = (
        spark.readStream.format("tidelog")
        .option("controllers", controllers)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    if max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_per_trigger))
    return (
        reader.load()
        .withColumn("key", F.coalesce("key", F.lit("(none)")))
        .groupBy("key")
        .agg(F.count("*").alias("messages"), F.max("timestamp").alias("last_stored"))
    )


def start(
    spark: SparkSession,
    controllers: str,
    topic: str,
    checkpoint: str,
    out: str,
    *,
    available_now: bool = False,
    max_per_trigger: int | None = None,
) -> StreamingQuery:
    def publish(table: DataFrame, batch_id: int) -> None:
        # Write beside the published copy, then swap: a reader never sees half a table.
        fresh = f"{out}.batch-{batch_id}"
        table.coalesce(1).write.mode("overwrite").parquet(fresh)
        old = f"{out}.old"
        if os.path.exists(out):
            os.replace(out, old)
        os.replace(fresh, out)
        shutil.rmtree(old, ignore_errors=True)

    writer = (
        counts(spark, controllers, topic, max_per_trigger=max_per_trigger)
        .writeStream.outputMode("complete")
        .foreachBatch(publish)
        .option("checkpointLocation", checkpoint)
    )
    trigger: dict[str, Any] = {"availableNow": True} if available_now else {"processingTime": "5 seconds"}
    return writer.trigger(**trigger).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--controllers", default=os.environ.get("TIDE_CONTROLLERS", ""), help="host:port[,...]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True, help="Parquet directory holding the latest counts")
    ap.add_argument("--max-per-trigger", type=int, default=None, help="maxOffsetsPerTrigger")
    ap.add_argument("--available-now", action="store_true", help="process what is there now, then exit")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.appName("tidelog-key-counts")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    register(spark)
    try:
        query = start(
            spark,
            args.controllers,
            args.topic,
            args.checkpoint,
            args.out,
            available_now=args.available_now,
            max_per_trigger=args.max_per_trigger,
        )
        query.awaitTermination()
        spark.read.parquet(args.out).orderBy(F.desc("messages")).show(20, truncate=False)
    except KeyboardInterrupt:
        pass
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
