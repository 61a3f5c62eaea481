"""Rows of the Spark source: pulled messages turned into Arrow record batches (or tuples).

Spark checks a returned `RecordBatch` against the declared schema type for type, so the Arrow
types here are exactly what Spark expects for each column (`string`, not `large_string`; `int32`
for `int`; microsecond UTC timestamps). Columns are built a whole chunk at a time: one list per
column, not one Python object per field, which is several times cheaper in Spark's workers.

`timestamp` is the broker's store time of the message (the log append time).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from tidelog.errors import InvalidArgumentError
from tidelog.proto import broker_pb2 as bpb
from tidelog.spark.plan import COLUMNS, HEADERS_COLUMN

ARROW_TYPES: dict[str, pa.DataType] = {
    "topic": pa.string(),
    "broker_set": pa.string(),
    "queue": pa.int32(),
    "offset": pa.int64(),
    "key": pa.string(),
    "tags": pa.string(),
    "body": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "headers": pa.map_(pa.string(), pa.string()),
}
KNOWN = {name for name, _ in COLUMNS} | {HEADERS_COLUMN[0]}


def check_columns(names: Sequence[str]) -> list[str]:
    """The requested column names, checked against what the source can produce."""
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise InvalidArgumentError(f"the tidelog source has no column(s) {unknown}; it has {sorted(KNOWN)}")
    return list(names)


def _column(name: str, msgs: Sequence[bpb.PulledMessage], topic: str, broker_set: str) -> pa.Array:
    n = len(msgs)
    kind = ARROW_TYPES[name]
    if name == "topic":
        return pa.repeat(pa.scalar(topic, kind), n)
    if name == "broker_set":
        return pa.repeat(pa.scalar(broker_set, kind), n)
    if name == "queue":
        return pa.repeat(pa.scalar(msgs[0].queue if n else 0, kind), n)
    if name == "offset":
        first = msgs[0].offset if n else 0
        return pa.array(range(first, first + n), kind)  # contiguous: checked by the range reader
    if name == "key":
        return pa.array([m.key if m.HasField("key") else None for m in msgs], kind)
    if name == "tags":
        return pa.array([m.tags if m.HasField("tags") else None for m in msgs], kind)
    if name == "body":
        return pa.array([m.body for m in msgs], kind)
    if name == "timestamp":
        return pa.array([m.store_ts for m in msgs], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(kind)
    if name == "headers":
        return pa.array([list(m.properties.items()) for m in msgs], kind)
    raise InvalidArgumentError(f"unknown column {name}")


def record_batch(
    msgs: Sequence[bpb.PulledMessage], topic: str, broker_set: str, names: Sequence[str]
) -> pa.RecordBatch:
    """One record batch holding `msgs`, with exactly the columns `names`, in that order."""
    schema = pa.schema([pa.field(n, ARROW_TYPES[n]) for n in names])
    return pa.RecordBatch.from_arrays([_column(n, msgs, topic, broker_set) for n in names], schema=schema)


def tuples(
    msgs: Sequence[bpb.PulledMessage], topic: str, broker_set: str, names: Sequence[str]
) -> list[tuple[Any, ...]]:
    """The same rows as one Python tuple per message (the slow path, kept to measure against)."""
    getters = {
        "topic": lambda m: topic,
        "broker_set": lambda m: broker_set,
        "queue": lambda m: m.queue,
        "offset": lambda m: m.offset,
        "key": lambda m: m.key if m.HasField("key") else None,
        "tags": lambda m: m.tags if m.HasField("tags") else None,
        "body": lambda m: m.body,
        "timestamp": lambda m: datetime.fromtimestamp(m.store_ts / 1000, tz=UTC),
        "headers": lambda m: dict(m.properties),
    }
    picks = [getters[n] for n in names]
    return [tuple(get(m) for get in picks) for m in msgs]
