"""Spark bench: rows/s reading a topic through the tidelog source, beside reading Parquet.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback,
`replication: sync`, `in_sync_replicas: 2`, `flush: async`, 256 MiB segments), produces
`--messages` messages with a 1 KiB body (no key, round robin over `--queues` queues) with the
Python client, then times these jobs in one local SparkSession (`local[2]`, default JVM flags):

- tidelog -> count:    `spark.read.format("tidelog")...load().count()` (the source has no column
                       pruning, so every column of every row is built and handed to Spark)
- tidelog -> noop:     the same rows written to Spark's `noop` sink (materialises every column)
- tidelog -> Parquet:  the same rows written to a Parquet file (snappy)
- the same with `rowFormat=tuples` (one Python tuple per row instead of Arrow record batches)
- tidelog (JVM data-port reader) -> count / noop: the same rows through `read_dataport`
                       (spark/dataport.py): planned in Python, pulled and turned into columnar
                       batches in the JVM, no Python worker; its count builds no column at all;
                       and its noop with no pull kept in flight ahead (read_ahead=0), to see
                       what the read-ahead buys
- Parquet -> count / noop / Parquet: the same jobs reading the Parquet file written above. A
  Parquet count is answered from the file's metadata, so compare the noop and Parquet jobs.
- the client alone: the range reads the executors run, in this one process, into Arrow batches
  (no Spark), as the ceiling one Python worker can reach against these brokers.
- conversion alone, per row, on `--convert` pulled records held in memory (the chunks the range
  reader returns: the stored bytes of whole records, as pulls answer them): what a Python worker
  spends turning them into what Spark takes, as Arrow record batches built from the buffer
  (`rows.record_batch`) or as tuples decoded record by record (`rows.tuples`) that PySpark then
  converts to Arrow itself (`records_to_arrow_batches`, the function its reader worker runs).

The source pulls stored record bytes (through the brokers' data port, which the bench cluster
runs by default) and builds Arrow columns straight from them (spark/rows.py).

Every job runs `--repeat` times; the table shows the median (and the range). Run from the
repository root:

    python -m bench.spark_read                       # 1,000,000 messages (or: make bench-spark)
    python -m bench.spark_read --messages 200000 --repeat 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cluster import BenchCluster
from bench.commitlog import code_version, pick_base_dir
from tidelog.client.aio import AsyncClient, OutMessage

TOPIC = "bench"


async def produce(controllers: str, count: int, size: int, batch: int = 1000, concurrency: int = 4) -> float:
    """Send `count` messages of `size` bytes (distinct bodies); returns the seconds it took."""
    client = AsyncClient(controllers, send_timeout=60.0)
    producer = client.producer()
    pad = b"x" * size
    next_i = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal next_i
        while next_i < count:
            first, next_i = next_i, min(count, next_i + batch)
            await producer.send_batch(
                TOPIC, [OutMessage((b"%012d" % i + pad)[:size]) for i in range(first, next_i)]
            )

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return time.perf_counter() - start


def client_only(controllers: str) -> tuple[float, int]:
    """Read the whole topic with the source's range reader in this process; (seconds, rows)."""
    from tidelog.spark import fetch, plan, rows

    view = fetch.run(lambda c: fetch.cluster_view(c, [TOPIC]), controllers)
    names = [n for n, _ in plan.COLUMNS]
    start = time.perf_counter()
    n = 0
    for s in view.states:
        for chunk in fetch.read_range(
            controllers,
            s.topic,
            s.broker_set,
            s.queue,
            s.min,
            s.confirmed,
            view.replicas[(s.topic, s.broker_set)],
        ):
            n += rows.record_batch(chunk, s.topic, s.broker_set, names).num_rows
    return time.perf_counter() - start, n


def conversion(spark: Any, controllers: str, limit: int, repeat: int) -> dict[str, float]:
    """Microseconds per row to turn pulled records into Arrow, both ways (in this process)."""
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from tidelog.spark import fetch, plan, rows

    view = fetch.run(lambda c: fetch.cluster_view(c, [TOPIC]), controllers)
    chunks = []
    held = 0
    for s in view.states:
        for chunk in fetch.read_range(
            controllers,
            s.topic,
            s.broker_set,
            s.queue,
            s.min,
            s.confirmed,
            view.replicas[(s.topic, s.broker_set)],
        ):
            chunks.append((s, chunk))
            held += len(chunk)
            if held >= limit:
                break
        if held >= limit:
            break
    names = [n for n, _ in plan.COLUMNS]
    schema = spark.createDataFrame([], plan.schema_ddl(False)).schema

    def arrow() -> int:
        out = (rows.record_batch(c, s.topic, s.broker_set, names) for s, c in chunks)
        return sum(b.num_rows for b in records_to_arrow_batches(out, 10_000, schema, None))

    def tuples() -> int:
        out = (t for s, c in chunks for t in rows.tuples(c, s.topic, s.broker_set, names))
        return sum(b.num_rows for b in records_to_arrow_batches(out, 10_000, schema, None))

    result = {}
    for name, fn in (("arrow", arrow), ("tuples", tuples)):
        secs = []
        for _ in range(max(3, repeat)):
            start = time.perf_counter()
            assert fn() == held
            secs.append(time.perf_counter() - start)
        result[name] = statistics.median(secs) / held * 1e6
    result["rows"] = held
    return result


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _spark_environment()
    work = Path(tempfile.mkdtemp(prefix="tidelog-spark-bench-", dir=pick_base_dir(None)))
    results = _header(args)
    jobs: dict[str, list[float]] = {}
    try:
        _run(args, work, results, jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _summarise(args, results, jobs)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    _print_table(args, results, jobs)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--convert", type=int, default=200_000, help="messages for the conversion measurement")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def _spark_environment() -> None:
    """Spark's Python workers run this interpreter and find the repository's modules; nothing
    listens beyond loopback."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)


def _header(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "messages": args.messages,
        "size": args.size,
        "queues": args.queues,
        "repeat": args.repeat,
        "code": code_version(("spark", "client", "broker", "bench/spark_read.py")),
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _run(args: argparse.Namespace, work: Path, results: dict[str, Any], jobs: dict[str, list[float]]) -> None:
    """Cluster up, produce, then every timed job; fills `results` and `jobs`, stops what it started."""
    (work / "cluster").mkdir()
    cluster = BenchCluster(
        work / "cluster",
        broker_options={
            "replication": "sync",
            "in_sync_replicas": 2,
            "auto_in_sync_replicas": True,
            "flush": "async",
            "segment_bytes": 256 << 20,
        },
    )
    spark = None
    try:
        cluster.start()
        cluster.wait_ready(TOPIC, args.queues)
        controllers = cluster.controller_address
        secs = asyncio.run(produce(controllers, args.messages, args.size))
        results["produce_msgs_per_s"] = round(args.messages / secs)
        _say(args, f"produced {args.messages:,} messages in {secs:.1f} s")

        secs, n = client_only(controllers)
        assert n == args.messages, f"read {n} of {args.messages}"
        jobs["client only -> Arrow (1 process, no Spark)"] = [secs]

        spark = _start_spark()
        parquet = str(work / "rows.parquet")
        jobs.update(_spark_jobs(spark, controllers, args, parquet, str(work / "copy.parquet")))
        results["conversion_us_per_row"] = conversion(
            spark, controllers, min(args.convert, args.messages), args.repeat
        )
        results["parquet_bytes"] = sum(f.stat().st_size for f in Path(parquet).glob("*.parquet"))
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()


def _start_spark() -> Any:
    from pyspark.sql import SparkSession

    from tidelog.spark import dataport, register

    spark = (
        dataport.configure(SparkSession.builder)
        .master("local[2]")
        .appName("tidelog-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _spark_jobs(
    spark: Any, controllers: str, args: argparse.Namespace, parquet: str, copy: str
) -> dict[str, list[float]]:
    """The timed Spark jobs, in the table's order: the tidelog source, then Parquet."""

    def source(row_format: str = "arrow") -> Any:
        return (
            spark.read.format("tidelog")
            .option("controllers", controllers)
            .option("topic", TOPIC)
            .option("rowFormat", row_format)
            .load()
        )

    def jvm_source(read_ahead: int = 2) -> Any:
        from tidelog.spark import read_dataport

        return read_dataport(spark, controllers, TOPIC, read_ahead=read_ahead)

    warm = source().limit(10).collect()  # JVM and Python workers warm, outside the timings
    assert len(warm) == 10
    assert len(jvm_source().limit(10).collect()) == 10

    def count(df_fn: Callable[[], Any]) -> None:
        got = df_fn().count()
        assert got == args.messages, f"counted {got} of {args.messages}"

    jobs: dict[str, list[float]] = {}
    jobs["tidelog -> count"] = timed(lambda: count(source), args.repeat)
    jobs["tidelog -> noop"] = timed(
        lambda: source().write.format("noop").mode("overwrite").save(), args.repeat
    )
    jobs["tidelog (tuples) -> noop"] = timed(
        lambda: source("tuples").write.format("noop").mode("overwrite").save(), args.repeat
    )
    jobs["tidelog (JVM data-port reader) -> count"] = timed(lambda: count(jvm_source), args.repeat)
    jobs["tidelog (JVM data-port reader) -> noop"] = timed(
        lambda: jvm_source().write.format("noop").mode("overwrite").save(), args.repeat
    )
    jobs["tidelog (JVM data-port reader, no read-ahead) -> noop"] = timed(
        lambda: jvm_source(0).write.format("noop").mode("overwrite").save(), args.repeat
    )
    jobs["tidelog -> Parquet"] = timed(lambda: source().write.mode("overwrite").parquet(parquet), args.repeat)
    jobs["Parquet -> count (metadata)"] = timed(
        lambda: count(lambda: spark.read.parquet(parquet)), args.repeat
    )
    jobs["Parquet -> noop"] = timed(
        lambda: spark.read.parquet(parquet).write.format("noop").mode("overwrite").save(), args.repeat
    )
    jobs["Parquet -> Parquet"] = timed(
        lambda: spark.read.parquet(parquet).write.mode("overwrite").parquet(copy), args.repeat
    )
    return jobs


def _summarise(args: argparse.Namespace, results: dict[str, Any], jobs: dict[str, list[float]]) -> None:
    results["jobs"] = {
        name: {
            "seconds": [round(s, 2) for s in secs],
            "rows_per_s": round(args.messages / statistics.median(secs)),
        }
        for name, secs in jobs.items()
    }
    med = {name: statistics.median(s) for name, s in jobs.items()}
    results["ratios"] = {
        "tidelog/Parquet, noop": round(med["tidelog -> noop"] / med["Parquet -> noop"], 1),
        "tidelog/Parquet, to Parquet": round(med["tidelog -> Parquet"] / med["Parquet -> Parquet"], 1),
        "tuples/Arrow, noop": round(med["tidelog (tuples) -> noop"] / med["tidelog -> noop"], 2),
        "JVM data-port reader/Parquet, noop": round(
            med["tidelog (JVM data-port reader) -> noop"] / med["Parquet -> noop"], 2
        ),
    }


def _print_table(args: argparse.Namespace, results: dict[str, Any], jobs: dict[str, list[float]]) -> None:
    print(
        f"\n{args.messages:,} messages of {args.size} B, {args.queues} queues; code {results['code']}; "
        f"{results['started']}; {os.cpu_count()} cores"
    )
    print(
        f"produce (Python client, batches of 1000, 4 in flight): {results['produce_msgs_per_s']:,} msgs/s\n"
    )
    print(f"| job | seconds (median{', range' if args.repeat > 1 else ''}) | rows/s |")
    print("| --- | ---: | ---: |")
    for name, secs in jobs.items():
        rng = f" ({min(secs):.1f}–{max(secs):.1f})" if len(secs) > 1 else ""
        print(
            f"| {name} | {statistics.median(secs):.1f}{rng} | "
            f"{args.messages / statistics.median(secs):,.0f} |"
        )
    conv = results["conversion_us_per_row"]
    print(
        f"\nconversion in one process, {conv['rows']:,} rows: Arrow batches {conv['arrow']:.2f} µs/row, "
        f"tuples + PySpark's conversion {conv['tuples']:.2f} µs/row"
    )
    print()
    for name, ratio in results["ratios"].items():
        print(f"time ratio {name}: {ratio}")


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
