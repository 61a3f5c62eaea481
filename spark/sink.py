"""The `tidelog` sink: DataFrame rows written to a topic, in batch and streaming queries.

    df.write.format("tidelog").option("controllers", c).option("topic", "orders").mode("append").save()
    df.writeStream.format("tidelog").option(...).option("checkpointLocation", path).start()

Rows need a `body` column (binary or string; strings are sent as UTF-8) and may have `key`,
`tags` (strings) and `headers` (map<string,string>, stored as the message's properties); other
columns (such as those the source produces) are ignored. Without a `topic` option, a `topic`
column names each row's topic. PySpark accepts only the `append` save mode for this sink
(`overwrite` is refused: a log cannot be overwritten), so a bare `.save()` fails in Spark before
reaching this code; `tidelog.spark.write` is a shortcut that sets the mode.

Each Spark task sends its rows with the Python client in batches and reports what it stored
(count and offset range per queue) in its commit message; the driver side logs the total. The
broker acknowledges only what its replication policy requires (`replication: sync` waits for the
in-sync replicas). Delivery is at-least-once: a task that fails after some of its sends were
acknowledged, or a send retried after a timeout, leaves those messages in the log, and Spark's
retry sends them again. There is no idempotent producer to deduplicate them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tidelog.client.aio import AsyncClient, OutMessage, Receipt
from tidelog.errors import InvalidArgumentError
from tidelog.spark import plan

log = logging.getLogger(__name__)

SEND_MAX_MESSAGES = 1000
SEND_MAX_BYTES = 4 << 20


@dataclass
class TidelogCommitMessage(WriterCommitMessage):
    """What one task stored: per (topic, broker set, queue), the count and the offsets' bounds."""

    partition: int
    count: int
    queues: dict[tuple[str, str, int], tuple[int, int, int]] = field(
        default_factory=dict
    )  # (count, first, last)


def messages_from_batch(batch: pa.RecordBatch, topic: str | None) -> list[tuple[str, OutMessage]]:
    """`(topic, message)` for every row of an Arrow batch, checked."""
    names = batch.schema.names
    if "body" not in names:
        raise InvalidArgumentError(
            f"the tidelog sink needs a body column (binary or string); the rows have {names}"
        )
    if topic is None and "topic" not in names:
        raise InvalidArgumentError("the tidelog sink needs option topic, or a topic column")

    def column(name: str) -> list[object]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * batch.num_rows

    for name in ("key", "tags", "topic"):
        if (
            name in names
            and not pa.types.is_string(batch.schema.field(name).type)
            and not pa.types.is_large_string(batch.schema.field(name).type)
        ):
            raise InvalidArgumentError(f"column {name} must be a string, not {batch.schema.field(name).type}")
    bodies, keys, tags = column("body"), column("key"), column("tags")
    headers = column("headers")
    topics = [topic] * batch.num_rows if topic is not None else column("topic")
    out = []
    for i in range(batch.num_rows):
        body = bodies[i]
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes):
            raise InvalidArgumentError(
                f"row {i}: body must be binary or string, not {type(body).__name__}"
                + (" (null)" if body is None else "")
            )
        t = topics[i]
        if not isinstance(t, str) or not t:
            raise InvalidArgumentError(f"row {i}: the topic column is empty")
        h = headers[i]
        props = dict(h) if h else None  # type: ignore[call-overload]
        out.append((t, OutMessage(body, keys[i], tags[i], props)))  # type: ignore[arg-type]
    return out


def _chunks(items: Sequence[OutMessage]) -> Iterator[list[OutMessage]]:
    chunk: list[OutMessage] = []
    size = 0
    for m in items:
        if chunk and (len(chunk) >= SEND_MAX_MESSAGES or size + len(m.body) > SEND_MAX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += len(m.body)
    if chunk:
        yield chunk


async def _send_all(
    client: AsyncClient, batches: Iterator[pa.RecordBatch], topic: str | None, partition: int
) -> TidelogCommitMessage:
    producer = client.producer()
    result = TidelogCommitMessage(partition, 0)

    def note(r: Receipt) -> None:
        q = (r.topic, r.broker_set, r.queue)
        n, first, last = result.queues.get(q, (0, r.queue_offset, r.queue_offset))
        result.queues[q] = (n + 1, min(first, r.queue_offset), max(last, r.queue_offset))

    for batch in batches:
        by_topic: dict[str, list[OutMessage]] = {}
        for t, m in messages_from_batch(batch, topic):
            by_topic.setdefault(t, []).append(m)
        for t, items in by_topic.items():
            # One chunk at a time: a key's messages stay in order within a task.
            for chunk in _chunks(items):
                for r in await producer.send_batch(t, chunk):
                    note(r)
                result.count += len(chunk)
    return result


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else -1
    except Exception:  # not in a Spark task (direct calls in tests)
        return -1


class _Writing:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgumentError(
                "the tidelog sink only appends; use mode('append')", hint="a log cannot be overwritten"
            )
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        self.controllers = plan.controllers_option(opts)
        self.connection = plan.Connection.parse(opts)
        self.topic = opts.get("topic") or None
        rpc_timeout = opts.get("sendtimeout")
        self.send_timeout = float(rpc_timeout) if rpc_timeout else 30.0
        names = [f.name for f in schema.fields]
        if "body" not in names:
            raise InvalidArgumentError(
                f"the tidelog sink needs a body column (binary or string); the rows have {names}"
            )
        if self.topic is None and "topic" not in names:
            raise InvalidArgumentError("the tidelog sink needs option topic, or a topic column")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidelogCommitMessage:
        partition = _partition_id()

        async def main() -> TidelogCommitMessage:
            client = AsyncClient(
                self.controllers, send_timeout=self.send_timeout, **self.connection.client_options()
            )
            try:
                return await _send_all(client, iterator, self.topic, partition)
            finally:
                await client.close()

        result = asyncio.run(main())
        log.info(
            "tidelog sink task %d stored %d message(s): %s",
            partition,
            result.count,
            {f"{t} {plan.queue_name(b, q)}": v for (t, b, q), v in sorted(result.queues.items())},
        )
        return result

    @staticmethod
    def _total(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, int]:
        done = [m for m in messages if isinstance(m, TidelogCommitMessage)]
        return sum(m.count for m in done), len(done)


class TidelogWriter(_Writing, DataSourceArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        count, tasks = self._total(messages)
        log.info("tidelog sink: %d message(s) stored by %d task(s)", count, tasks)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        count, tasks = self._total(messages)
        log.warning(
            "tidelog sink: job failed; %d message(s) from %d finished task(s) stay in the log, and "
            "failed tasks may have stored part of their rows (at-least-once)",
            count,
            tasks,
        )


class TidelogStreamWriter(_Writing, DataSourceStreamArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        count, tasks = self._total(messages)
        log.info("tidelog sink: batch %d: %d message(s) stored by %d task(s)", batchId, count, tasks)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        count, tasks = self._total(messages)
        log.warning(
            "tidelog sink: batch %d failed; %d message(s) from %d finished task(s) stay in the log "
            "and will be sent again when the batch is retried (at-least-once)",
            batchId,
            count,
            tasks,
        )
