"""Rows of the Spark source: pulled records turned into Arrow record batches (or tuples).

A chunk is the stored bytes of whole records with the header fields a row needs, read when the
reply was checked (spark/records.py; commitlog/FORMAT.md "Record"), and the columns are built
from them directly: the integer columns are packed into arrays whose bytes become Arrow buffers,
and the bodies are copied once, into the values buffer of the binary column. Properties (key, tags, headers)
are decoded only when one of those columns is asked for, and only for records that have any.
No Python object is made per message beyond a body's slice and a header's tuple.

Spark checks a returned `RecordBatch` against the declared schema type for type, so the Arrow
types here are exactly what Spark expects for each column (`string`, not `large_string`; `int32`
for `int`; microsecond UTC timestamps).

`timestamp` is the broker's store time of the message (the log append time).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import accumulate
from operator import sub
from typing import Any

import pyarrow as pa

from tidelog.commitlog import record as rec
from tidelog.errors import InvalidArgumentError
from tidelog.spark import records
from tidelog.spark.plan import COLUMNS, HEADERS_COLUMN
from tidelog.spark.records import Chunk

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
PROPERTY_COLUMNS = frozenset({"key", "tags", "headers"})

_MS_TIMESTAMP = pa.timestamp("ms", tz="UTC")
# array typecodes of exactly 8 and 4 bytes, for buffers Arrow reads as int64 and int32
_I64 = next(code for code in "lq" if array(code).itemsize == 8)
_I32 = next(code for code in "ihl" if array(code).itemsize == 4)


def check_columns(names: Sequence[str]) -> list[str]:
    """The requested column names, checked against what the source can produce."""
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise InvalidArgumentError(f"the tidelog source has no column(s) {unknown}; it has {sorted(KNOWN)}")
    return list(names)


def _int_array(values: Sequence[int], kind: pa.DataType, code: str) -> pa.Array:
    packed = array(code, values)
    return pa.Array.from_buffers(kind, len(packed), [None, pa.py_buffer(packed)])


def body_array(data: bytes | memoryview, fields: records.Fields) -> pa.Array:
    """The binary column: value offsets from the body lengths, values as one join of the bodies'
    slices of the buffer (memoryviews: the join is the only copy)."""
    n = len(fields.body_ends)
    lens = map(sub, fields.body_ends, fields.body_starts)
    value_offsets = array(_I32, accumulate(lens, initial=0))
    with memoryview(data) as mv:
        values = b"".join(map(mv.__getitem__, map(slice, fields.body_starts, fields.body_ends)))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])


def _property_column(name: str, props: list[dict[str, str] | None]) -> pa.Array:
    kind = ARROW_TYPES[name]
    if not any(props):  # the common case: no record of the chunk has properties
        if name == "headers":
            empty = pa.array([], pa.string())
            return pa.MapArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), len(props) + 1), empty, empty)
        return pa.nulls(len(props), kind)
    if name == "headers":
        reserved = rec.RESERVED_PROPERTIES
        return pa.array([[kv for kv in p.items() if kv[0] not in reserved] if p else [] for p in props], kind)
    prop = rec.PROP_KEYS if name == "key" else rec.PROP_TAGS
    return pa.array([p.get(prop) if p else None for p in props], kind)


def _column(name: str, chunk: Chunk, topic: str, broker_set: str) -> pa.Array:
    n = len(chunk)
    kind = ARROW_TYPES[name]
    if name == "topic":
        return pa.repeat(pa.scalar(topic, kind), n)
    if name == "broker_set":
        return pa.repeat(pa.scalar(broker_set, kind), n)
    if name == "queue":
        return pa.repeat(pa.scalar(chunk.queue(), kind), n)
    if name == "offset":
        return _int_array(chunk.fields.offsets, kind, _I64)
    if name == "body":
        return body_array(chunk.data, chunk.fields)
    if name == "timestamp":
        return _int_array(chunk.fields.store_ts, pa.int64(), _I64).view(_MS_TIMESTAMP).cast(kind)
    raise InvalidArgumentError(f"unknown column {name}")


def record_batch(chunk: Chunk, topic: str, broker_set: str, names: Sequence[str]) -> pa.RecordBatch:
    """One record batch holding the records of `chunk`, with exactly the columns `names`, in that
    order."""
    props = records.properties(chunk.data, chunk.fields) if PROPERTY_COLUMNS.intersection(names) else []
    schema = pa.schema([pa.field(n, ARROW_TYPES[n]) for n in names])
    columns = [
        _property_column(n, props) if n in PROPERTY_COLUMNS else _column(n, chunk, topic, broker_set)
        for n in names
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def tuples(chunk: Chunk, topic: str, broker_set: str, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """The same rows as one Python tuple per message, each record decoded on its own through
    `RecordView` (the slow path, kept to measure against)."""
    getters = {
        "topic": lambda m: topic,
        "broker_set": lambda m: broker_set,
        "queue": lambda m: m.queue,
        "offset": lambda m: m.offset,
        "key": lambda m: m.key,
        "tags": lambda m: m.tags,
        "body": lambda m: m.body,
        "timestamp": lambda m: datetime.fromtimestamp(m.store_ts / 1000, tz=UTC),
        "headers": lambda m: dict(m.properties),
    }
    picks = [getters[n] for n in names]
    return [tuple(get(m) for get in picks) for m in chunk]
