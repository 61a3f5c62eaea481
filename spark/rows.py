"""Rows of the Spark source: pulled records turned into Arrow record batches (or tuples).

A chunk is the stored bytes of whole records (spark/fetch.py `Chunk`; commitlog/FORMAT.md
"Record"), and the columns are built from that buffer directly: one pass unpacks the few header
fields a row needs (queue offset, store time, properties and body lengths) for every record at
once, the integer columns are packed into arrays whose bytes become Arrow buffers, and the bodies
are copied once, into the values buffer of the binary column. Properties (key, tags, headers)
are decoded only when one of those columns is asked for, and only for records that have any.
No Python object is made per message beyond a body's slice and a header's tuple.

Spark checks a returned `RecordBatch` against the declared schema type for type, so the Arrow
types here are exactly what Spark expects for each column (`string`, not `large_string`; `int32`
for `int`; microsecond UTC timestamps).

`timestamp` is the broker's store time of the message (the log append time).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import accumulate, compress, repeat
from operator import add, sub
from typing import Any, NamedTuple

import pyarrow as pa

from tidelog.commitlog import record as rec
from tidelog.errors import InvalidArgumentError
from tidelog.spark.fetch import Chunk
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
PROPERTY_COLUMNS = frozenset({"key", "tags", "headers"})

#: The header fields a row needs (commitlog/FORMAT.md "Record"): total_size, then (skipping magic,
#: crc, flags, topic_len, queue_id, epoch) queue_offset, then (skipping phys_offset, born_ts)
#: store_ts, props_len, body_len.
_ROW_FIELDS = struct.Struct(">I20xQ16xQII")
_QUEUE_ID = struct.Struct(">16xI")
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


class Fields(NamedTuple):
    """The header fields of every record of a chunk, one sequence per field, in record order."""

    offsets: Sequence[int]
    store_ts: Sequence[int]
    body_starts: Sequence[int]
    body_ends: Sequence[int]
    props_lens: Sequence[int]


def scan(data: bytes, starts: Sequence[int]) -> Fields:
    """One pass over the records' headers (already checked by the reader). The loops run in C:
    `map` unpacks, `zip` turns the rows of fields into columns."""
    if not starts:
        return Fields((), (), (), (), ())
    sizes, offsets, stamps, plens, blens = zip(
        *map(_ROW_FIELDS.unpack_from, repeat(data), starts), strict=True
    )
    ends = list(map(add, starts, sizes))
    return Fields(offsets, stamps, list(map(sub, ends, blens)), ends, plens)


def _int_array(values: Sequence[int], kind: pa.DataType, code: str) -> pa.Array:
    packed = array(code, values)
    return pa.Array.from_buffers(kind, len(packed), [None, pa.py_buffer(packed)])


def body_array(data: bytes, fields: Fields) -> pa.Array:
    """The binary column: value offsets from the body lengths, values as one join of the bodies'
    slices of the buffer (memoryviews: the join is the only copy)."""
    n = len(fields.body_ends)
    lens = map(sub, fields.body_ends, fields.body_starts)
    value_offsets = array(_I32, accumulate(lens, initial=0))
    with memoryview(data) as mv:
        values = b"".join(map(mv.__getitem__, map(slice, fields.body_starts, fields.body_ends)))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])


def properties(data: bytes, fields: Fields) -> list[dict[str, str] | None]:
    """Each record's properties (KEYS and TAGS included), None for a record without any."""
    out: list[dict[str, str] | None] = [None] * len(fields.props_lens)
    for i in compress(range(len(out)), fields.props_lens):
        end = fields.body_starts[i]
        out[i] = rec.decode_properties(data[end - fields.props_lens[i] : end])
    return out


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


def _column(name: str, chunk: Chunk, fields: Fields, topic: str, broker_set: str) -> pa.Array:
    n = len(chunk)
    kind = ARROW_TYPES[name]
    if name == "topic":
        return pa.repeat(pa.scalar(topic, kind), n)
    if name == "broker_set":
        return pa.repeat(pa.scalar(broker_set, kind), n)
    if name == "queue":
        queue = _QUEUE_ID.unpack_from(chunk.data, chunk.starts[0])[0] if n else 0
        return pa.repeat(pa.scalar(queue, kind), n)
    if name == "offset":
        return _int_array(fields.offsets, kind, _I64)
    if name == "body":
        return body_array(chunk.data, fields)
    if name == "timestamp":
        return _int_array(fields.store_ts, pa.int64(), _I64).view(_MS_TIMESTAMP).cast(kind)
    raise InvalidArgumentError(f"unknown column {name}")


def record_batch(chunk: Chunk, topic: str, broker_set: str, names: Sequence[str]) -> pa.RecordBatch:
    """One record batch holding the records of `chunk`, with exactly the columns `names`, in that
    order."""
    fields = scan(chunk.data, chunk.starts)
    props = properties(chunk.data, fields) if PROPERTY_COLUMNS.intersection(names) else []
    schema = pa.schema([pa.field(n, ARROW_TYPES[n]) for n in names])
    columns = [
        _property_column(n, props) if n in PROPERTY_COLUMNS else _column(n, chunk, fields, topic, broker_set)
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
