"""PySpark data source and sink that read only confirmed offsets (install with the `spark` extra).

    from tidelog.spark import register
    register(spark)                                       # spark.dataSource.register(TidelogDataSource)
    df = (spark.read.format("tidelog").option("controllers", "127.0.0.1:9701")
          .option("topic", "orders").load())

Modules: `plan` (pure decisions: options, offsets, ranges, budgets, data loss), `fetch` (queue
offsets and range reads against the cluster), `records` (a pull reply's records, checked),
`rows` (Arrow record batches built from them), `source` (the
PySpark classes), `sink` (writers), `dataport` (batch reads planned here and read in the JVM by
spark/jvm's reader: `read_dataport`). `plan` needs neither pyspark nor pyarrow; the names below are
imported on first use so that it stays importable without them.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidelog.spark.source import TidelogDataSource

__all__ = ["TidelogDataSource", "read_dataport", "register", "write"]

# Spark starts its Python workers (which import this package) with `python3` from PATH unless
# PYSPARK_PYTHON names another interpreter; outside an activated venv that interpreter has no
# tidelog and every read fails with "No module named 'tidelog.spark'"
# (`docs/reference/pyspark-datasource.md` §4). Importing this package before the session is
# created, as every job must to register the source, makes the workers run this interpreter
# unless the caller chose one.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def register(spark: SparkSession) -> None:
    """Make `format("tidelog")` available in this SparkSession (one call per session)."""
    from tidelog.spark.source import TidelogDataSource

    spark.dataSource.register(TidelogDataSource)


def write(df: DataFrame, topic: str, controllers: str, **options: str) -> None:
    """`df` appended to `topic`: the sink with the one save mode it supports."""
    writer = df.write.format("tidelog").option("controllers", controllers).option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def read_dataport(
    spark: SparkSession, controllers: str | None = None, topic: str | None = None, **options: Any
) -> DataFrame:
    """A batch read of `topic` by the JVM data-port reader (spark/dataport.py; the session needs
    its jar: `tidelog.spark.dataport.configure(builder)`)."""
    from tidelog.spark import dataport

    return dataport.read_dataport(spark, controllers, topic, **options)


def __getattr__(name: str) -> Any:
    if name == "TidelogDataSource":
        try:
            from tidelog.spark.source import TidelogDataSource
        except ImportError as exc:
            raise ImportError(
                f"tidelog.spark needs pyspark and pyarrow: pip install 'tidelog[spark]' ({exc})"
            ) from exc
        return TidelogDataSource
    raise AttributeError(name)
