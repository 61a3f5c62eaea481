"""The PySpark data source `tidelog`: batch and streaming readers (and, via `sink`, writers).

    spark.dataSource.register(TidelogDataSource)        # or tidelog.spark.register(spark)
    spark.read.format("tidelog").option("controllers", "127.0.0.1:9701").option("topic", "orders").load()

Where each method runs matters (PySpark's Python data sources run nothing in the driver's Python
process): `schema()` and planning (`partitions()`, `latestOffset()`) run in Spark's Python
workers on the driver side; `read()` runs in executor workers, from a pickled copy of the reader
and one partition. So the reader holds only options, and a partition carries everything its
read needs: the queue, the planned `[start, end)` and the replicas to read it from.

Planning reads each queue's *confirmed* offset and never plans past it; the planned ranges are
frozen into the DataFrame's plan (and, when streaming, into the checkpoint), so a retried task,
a second action or a restarted query reads exactly the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.errors import InvalidArgumentError
from tidelog.spark import fetch, plan, rows

log = logging.getLogger(__name__)

ROW_FORMATS = ("arrow", "tuples")


@dataclass
class TidelogPartition(InputPartition):
    """One Spark task's work: offsets `[start, end)` of one queue."""

    topic: str
    broker_set: str
    queue: int
    start: int
    end: int
    earliest: bool
    replicas: tuple[str, ...]  # slaves first; empty: ask the controller at read time


def _tasks(
    parts: list[plan.Range], replicas: Mapping[tuple[str, str], tuple[str, ...]]
) -> list[TidelogPartition]:
    """A Spark partition per planned range, with the replicas its broker set is read from."""
    return [
        TidelogPartition(
            r.topic,
            r.broker_set,
            r.queue,
            r.start,
            r.end,
            r.earliest,
            tuple(replicas.get((r.topic, r.broker_set), ())),
        )
        for r in parts
    ]


def _row_format(options: Mapping[str, str]) -> str:
    value = str(options.get("rowformat", "arrow")).strip().lower()
    if value not in ROW_FORMATS:
        raise InvalidArgumentError(f"option rowFormat must be one of {ROW_FORMATS}, not {value!r}")
    return value


class _Reading:
    """What batch and streaming readers share: options, the columns asked for, and `read()`."""

    def __init__(self, options: Mapping[str, str], schema: StructType, *, streaming: bool) -> None:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        self.opts = plan.ReadOptions.parse(opts, streaming=streaming)
        # A narrower user schema (spark.read.schema(...)) is honoured: unasked columns are not built.
        self.columns = rows.check_columns([f.name for f in schema.fields])
        self.row_format = _row_format(opts)

    def _partitions(
        self, ranges: list[plan.Range], replicas: Mapping[tuple[str, str], tuple[str, ...]]
    ) -> list[TidelogPartition]:
        return _tasks(plan.split_ranges(ranges, self.opts.max_offsets_per_partition), replicas)

    def read(self, partition: TidelogPartition) -> Iterator[Any]:
        p = partition
        chunks = fetch.read_range(
            self.opts.controllers,
            p.topic,
            p.broker_set,
            p.queue,
            p.start,
            p.end,
            p.replicas,
            fail_on_data_loss=self.opts.fail_on_data_loss and not p.earliest,
            max_messages=self.opts.fetch_max_messages,
            timeout=self.opts.read_timeout_s,
            connection=self.opts.connection,
        )
        if self.row_format == "arrow":
            for chunk in chunks:
                yield rows.record_batch(chunk, p.topic, p.broker_set, self.columns)
        else:
            for chunk in chunks:
                yield from rows.tuples(chunk, p.topic, p.broker_set, self.columns)


class TidelogBatchReader(_Reading, DataSourceReader):  # type: ignore[misc]  # read() is _Reading's
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        _Reading.__init__(self, options, schema, streaming=False)

    def partitions(self) -> list[TidelogPartition]:  # type: ignore[override]
        o = self.opts
        view = fetch.run(lambda c: fetch.cluster_view(c, o.topics), o.controllers, connection=o.connection)
        return _tasks(fetch.batch_plan(view, o, "batch read"), view.replicas)


class TidelogStreamReader(  # type: ignore[misc]  # read() is _Reading's
    _Reading, DataSourceStreamReader, SupportsTriggerAvailableNow
):
    """Offsets are `{"topic": {"broker-a:0": next offset}}`; each micro-batch ends at confirmed offsets.

    Spark keeps one instance of this class per running query for the calls below (in one worker
    process); `read()` runs on other, pickled copies, so nothing set here reaches it.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        _Reading.__init__(self, options, schema, streaming=True)
        self._replicas: dict[tuple[str, str], tuple[str, ...]] = {}
        self._target: list[plan.QueueState] | None = None  # availableNow: the offsets to stop at

    def _view(self) -> fetch.ClusterView:
        o = self.opts
        view = fetch.run(
            lambda c: fetch.cluster_view(c, o.topics, timeout=o.read_timeout_s),
            o.controllers,
            connection=o.connection,
        )
        self._replicas = dict(view.replicas)
        return view

    def initialOffset(self) -> dict:
        view = self._view()
        start: plan.Offsets = {}
        for s in view.states:
            want = self.opts.starting.for_queue(s.qid)
            start[s.qid] = s.min if want == plan.EARLIEST else s.confirmed if want == plan.LATEST else want
        missing = set(self.opts.starting.explicit) - set(start)
        if missing:
            raise InvalidArgumentError(
                f"startingOffsets names queues the topics do not have: "
                f"{plan.offsets_to_json(dict.fromkeys(missing, 0))}"
            )
        log.info("tidelog stream of %s starts at %s", ",".join(self.opts.topics), plan.offsets_to_json(start))
        return plan.offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Fix the end now, so that the query ends even while producers keep writing, and still
        # splits the backlog into micro-batches of maxOffsetsPerTrigger.
        self._target = self._view().states
        log.info(
            "tidelog stream of %s reads until %s (availableNow)",
            ",".join(self.opts.topics),
            plan.offsets_to_json({s.qid: s.confirmed for s in self._target}),
        )

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[override]
        states = self._target if self._target is not None else self._view().states
        current, latest = plan.next_offsets(plan.offsets_from_json(start, what="start offset"), states)
        # Only the engine's limit counts: under availableNow it passes ReadAllAvailable to fix the
        # target, and capping that with the option would end the query early with data unread.
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan.offsets_to_json(plan.budget(current, latest, cap))

    def partitions(self, start: dict, end: dict) -> list[TidelogPartition]:  # type: ignore[override]
        ranges = plan.stream_ranges(
            plan.offsets_from_json(start, what="start offset"), plan.offsets_from_json(end, what="end offset")
        )
        return self._partitions(ranges, self._replicas)

    def commit(self, end: dict) -> None:
        # Nothing to acknowledge: the checkpoint is the query's position (Spark calls this a
        # batch late, and not at all for the last batch before a stop).
        log.debug("tidelog stream committed %s", end)


class TidelogDataSource(DataSource):
    """`format("tidelog")`: read topics (batch or streaming) and write DataFrames to a topic."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> str:
        opts = {str(k).lower(): str(v) for k, v in self.options.items()}
        return plan.schema_ddl(plan.bool_option(opts, "includeHeaders", False))

    def reader(self, schema: StructType) -> TidelogBatchReader:
        return TidelogBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> TidelogStreamReader:
        return TidelogStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from tidelog.spark.sink import TidelogWriter

        return TidelogWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from tidelog.spark.sink import TidelogStreamWriter

        return TidelogStreamWriter(self.options, schema, overwrite)
