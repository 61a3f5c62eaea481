"""Batch reads in the JVM: `format("tidelog-dataport")`, planned here, read by spark/jvm's Java reader.

    from tidelog.spark import dataport
    spark = dataport.configure(SparkSession.builder.master("local[2]")).getOrCreate()
    df = dataport.read_dataport(spark, controllers="127.0.0.1:9701", topic="orders")

What runs where: planning runs here, in the driver's Python process, with the Python source's
own calls (`fetch.cluster_view`, `plan.resolve_ranges`, `plan.split_ranges`, the same
`plan.ReadOptions`): one `[start, end)` per Spark partition, every end at or below its queue's
confirmed offset, and for each broker set the data-port addresses of its replicas (each broker's
`Status` names its data port), slaves first. The plan travels as JSON in the option `plan`; the
Java reader (spark/jvm, a DataSource V2 in the executors' JVMs) pulls each range from the data
ports and fills Spark's columnar batches directly, so no Python worker handles a row.

What it guarantees: the same rows as `format("tidelog")` for the same options (every column, byte
for byte), only confirmed offsets, each range read exactly (contiguous offsets, never past its
end) from whichever replica answers, and the Python reader's failOnDataLoss rule. The ranges are
frozen into the DataFrame, so a second action reads the same rows; a new `read_dataport` plans
again.

What it does not do: streaming (use `readStream.format("tidelog")`); TLS clusters (and so auth,
which needs TLS) are refused at planning with InvalidArgumentError: read them with
`format("tidelog")`. The replicas are those of planning time: a broker set whose members are all
replaced while a job runs fails its tasks (the Python reader asks the controllers again).

The SparkSession must have the jar on its classpath: `configure(builder)` adds it (`spark.jars`),
or pass `jar_path()` to spark-submit's `--jars`. `make spark` builds it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidelog.client.aio import AsyncClient
from tidelog.errors import ConfigError, InvalidArgumentError, TidelogError, UnavailableError
from tidelog.spark import fetch, plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

FORMAT = "tidelog-dataport"
JAR = Path(__file__).resolve().parent / "jvm" / "tidelog-spark.jar"
#: The plan's layout version; the Java reader (ReadPlan.java) refuses any other.
PLAN_VERSION = 1
#: Pulls each task keeps in flight beyond the one it waits for (PullPipeline.java).
READ_AHEAD = 2


def jar_path() -> str:
    """The data-port reader's jar; ConfigError when it has not been built."""
    if not JAR.is_file():
        raise ConfigError(
            f"the tidelog data-port reader's jar {JAR} is not built",
            hint="run `make spark` (it compiles spark/jvm with javac), then start the SparkSession again",
        )
    return str(JAR)


def configure(builder: SparkSession.Builder, *jars: str) -> SparkSession.Builder:
    """`builder` with the reader's jar (and `jars`, other jars the job needs) as `spark.jars`.

    Jars must be set before the session starts; one session cannot take them afterwards."""
    return builder.config("spark.jars", ",".join((jar_path(), *jars)))


def read_dataport(
    spark: SparkSession,
    controllers: str | None = None,
    topic: str | None = None,
    *,
    read_ahead: int = READ_AHEAD,
    **options: str,
) -> DataFrame:
    """A batch DataFrame of the confirmed messages of `topic` (or `topics=`), read in the JVM.

    `options` are the Python source's (spark/plan.py `ReadOptions`: startingOffsets,
    endingOffsets, includeHeaders, failOnDataLoss, maxOffsetsPerPartition, fetchMaxMessages,
    readTimeout, ...); `read_ahead` pulls are kept in flight per task beyond the one awaited."""
    opts: dict[str, str] = {str(k): str(v) for k, v in options.items()}
    if controllers is not None:
        opts["controllers"] = controllers
    if topic is not None:
        opts["topic"] = topic
    if not 0 <= read_ahead <= 16:
        raise InvalidArgumentError(f"read_ahead must be in 0..16, not {read_ahead}")
    jar_path()  # a clear error before any planning when the jar was never built
    o = plan.ReadOptions.parse({k.lower(): v for k, v in opts.items()}, streaming=False)
    doc = plan_json(o, read_ahead)
    try:
        return spark.read.format(FORMAT).option("plan", doc).load()
    except Exception as exc:
        if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find the data source" in str(exc):
            raise ConfigError(
                f"this SparkSession does not have the {FORMAT} reader on its classpath",
                hint=f"start it with tidelog.spark.dataport.configure(builder) (spark.jars={JAR})",
            ) from None
        raise


def plan_json(o: plan.ReadOptions, read_ahead: int = READ_AHEAD) -> str:
    """The option `plan` for a batch read with options `o` (the cluster asked now)."""
    partitions = fetch.run(lambda c: _partitions(c, o), o.controllers, connection=o.connection)
    return json.dumps(
        {
            "version": PLAN_VERSION,
            "includeHeaders": o.include_headers,
            "failOnDataLoss": o.fail_on_data_loss,
            "fetchMaxMessages": o.fetch_max_messages,
            "readTimeoutMs": max(1, round(o.read_timeout_s * 1000)),
            "readAhead": read_ahead,
            "partitions": partitions,
        }
    )


async def _partitions(client: AsyncClient, o: plan.ReadOptions) -> list[dict[str, Any]]:
    """The planned ranges, as the Python source plans them (TidelogBatchReader.partitions), each
    with the data ports of its broker set."""
    if client.tls is not None:
        raise InvalidArgumentError(
            "the tidelog data-port reader does not speak TLS, and this connection uses it",
            hint='read this cluster with spark.read.format("tidelog") (tidelog.spark.register(spark))',
        )
    view = await fetch.cluster_view(client, o.topics)
    parts = fetch.batch_plan(view, o, "data-port read")
    ports = await data_ports(client, view.replicas)
    return [
        {
            "topic": r.topic,
            "brokerSet": r.broker_set,
            "queue": r.queue,
            "start": r.start,
            "end": r.end,
            "earliest": r.earliest,
            "replicas": list(ports[(r.topic, r.broker_set)]),
        }
        for r in parts
    ]


async def data_ports(
    client: AsyncClient, replicas: Mapping[tuple[str, str], Sequence[str]]
) -> dict[tuple[str, str], tuple[str, ...]]:
    """Each broker set's replicas as data-port addresses, in the planned order. A replica that
    does not answer its Status now, or has no data port, is left out (its tasks read from the
    others); a broker set left with none is UnavailableError."""
    brokers = sorted({a for addresses in replicas.values() for a in addresses})
    answers = await asyncio.gather(*(client.data_address(a) for a in brokers), return_exceptions=True)
    found: dict[str, str] = {}
    for broker, answer in zip(brokers, answers, strict=True):
        if isinstance(answer, TidelogError):
            log.warning(
                "broker %s did not say where its data port is (%s); not reading from it", broker, answer
            )
        elif isinstance(answer, BaseException):
            raise answer
        elif not answer:
            log.warning("broker %s has no data port; not reading from it", broker)
        else:
            found[broker] = answer
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for (topic, broker_set), addresses in replicas.items():
        ports = tuple(found[a] for a in addresses if a in found)
        if not ports:
            raise UnavailableError(
                f"no replica of broker set {broker_set} (topic {topic}) has a data port that answers: "
                f"{list(addresses)}",
                hint='check the brokers, or read with spark.read.format("tidelog")',
            )
        out[(topic, broker_set)] = ports
    return out
