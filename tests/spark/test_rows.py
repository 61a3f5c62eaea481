"""Records -> Arrow (spark/rows.py) against the commit log's own codec: messages a producer
encodes, stored and read back as bytes by a real CommitLog, converted column by column (no Spark)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog
from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import encode_batch, walk
from tidelog.errors import CorruptRecordError
from tidelog.spark import records, rows
from tidelog.spark.records import Chunk


@dataclass(frozen=True)
class Out:
    body: bytes
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None


values = st.text(max_size=12)
outs = st.builds(
    Out,
    body=st.binary(max_size=200),
    key=st.none() | values,
    tags=st.none() | values,
    properties=st.none()
    | st.dictionaries(
        st.text(min_size=1, max_size=6).filter(lambda k: k not in rec.RESERVED_PROPERTIES), values, max_size=3
    ),
)
ALL = list(rows.ARROW_TYPES)


def stored(
    directory: str, before: int, batch: list[Out], queue: int
) -> tuple[bytes, list[rec.StoredMessage]]:
    """`batch` appended after `before` other messages, confirmed; its stored bytes, and the records as
    the log decodes them."""
    log = CommitLog.open(directory)
    try:
        if before:
            log.append_encoded(
                "orders", queue, bytearray(encode_batch(b"orders", queue, [Out(b"x")] * before, 9)), before
            )
        data = bytearray(encode_batch(b"orders", queue, batch, 1234))
        first, _ = log.append_encoded("orders", queue, data, len(batch))
        log.confirm_offset = log.max_offset
        raw, count = log.read_encoded("orders", queue, first, len(batch), 1 << 20)
        assert count == len(batch)
        return raw, log.read("orders", queue, first, len(batch))
    finally:
        log.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(outs, min_size=1, max_size=25), st.integers(0, 5), st.integers(0, 3))
def test_records_become_the_columns_of_their_messages(tmp_path_factory, batch, before, queue):  # type: ignore[no-untyped-def]
    raw, msgs = stored(str(tmp_path_factory.mktemp("log")), before, batch, queue)
    chunk = Chunk.of(raw, "broker-a")
    got = rows.record_batch(chunk, "orders", "broker-a", ALL)
    got.validate(full=True)
    assert got.schema == pa.schema([pa.field(n, t) for n, t in rows.ARROW_TYPES.items()])
    cols = got.to_pydict()
    n = len(batch)
    assert cols["topic"] == ["orders"] * n and cols["broker_set"] == ["broker-a"] * n
    assert cols["queue"] == [queue] * n
    assert cols["offset"] == list(range(before, before + n)) == [m.queue_offset for m in msgs]
    assert cols["body"] == [o.body for o in batch]
    assert cols["key"] == [o.key for o in batch]
    assert cols["tags"] == [o.tags for o in batch]
    assert [dict(h) for h in cols["headers"]] == [o.properties or {} for o in batch]
    assert cols["timestamp"] == [datetime.fromtimestamp(m.store_ts / 1000, tz=UTC) for m in msgs]
    # The slow path gives the same rows.
    as_tuples = [tuple(dict(v) if isinstance(v, list) else v for v in r.values()) for r in got.to_pylist()]
    assert rows.tuples(chunk, "orders", "broker-a", ALL) == as_tuples


@settings(max_examples=30, deadline=None)
@given(st.lists(outs, min_size=1, max_size=10), st.permutations(ALL), st.integers(1, len(ALL)))
def test_any_subset_of_columns_in_any_order(tmp_path_factory, batch, order, k):  # type: ignore[no-untyped-def]
    raw, _ = stored(str(tmp_path_factory.mktemp("log")), 0, batch, 0)
    chunk = Chunk.of(raw, "b")
    names = list(order[:k])
    full = rows.record_batch(chunk, "orders", "b", ALL)
    part = rows.record_batch(chunk, "orders", "b", names)
    assert part.schema.names == names
    assert part.equals(full.select(names))


def test_records_past_the_chunk_are_not_converted() -> None:
    # A chunk may keep only the first records of a reply's buffer (the range's end).
    parts = [
        rec.encode(
            topic=b"t",
            props=b"",
            body=b"b%d" % i,
            flags=0,
            queue_id=1,
            epoch=1,
            queue_offset=10 + i,
            phys_offset=0,
            born_ts=1,
            store_ts=2_000,
        )
        for i in range(5)
    ]
    data = b"".join(parts)
    whole = Chunk.of(data, "b")
    chunk = Chunk(data, whole.fields.head(3), "b")
    got = rows.record_batch(chunk, "t", "b", ["offset", "body", "key", "headers"]).to_pydict()
    assert got == {
        "offset": [10, 11, 12],
        "body": [b"b0", b"b1", b"b2"],
        "key": [None] * 3,
        "headers": [[]] * 3,
    }
    assert rows.record_batch(Chunk.of(b"", "b"), "t", "b", ALL).num_rows == 0


def _outcome(fn: Callable[[], Sequence[int]]) -> Sequence[int] | str:
    try:
        return list(fn())
    except CorruptRecordError:
        return "corrupt"


@settings(max_examples=60, deadline=None)
@given(st.lists(outs, min_size=1, max_size=8), st.data())
def test_the_scan_checks_records_as_the_commit_log_does(tmp_path_factory, batch, data):  # type: ignore[no-untyped-def]
    raw, msgs = stored(str(tmp_path_factory.mktemp("log")), 0, batch, 2)
    fields = records.scan(raw, "test")
    assert list(fields.starts) == walk(raw, "test", 0)
    views = list(Chunk(raw, fields, "b"))
    assert list(fields.offsets) == [v.offset for v in views] and list(fields.store_ts) == [
        v.store_ts for v in views
    ]
    # One byte flipped, or the buffer cut short: the scan refuses exactly what walk refuses.
    at = data.draw(st.integers(0, len(raw) - 1))
    damaged = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :]
    cut = raw[: data.draw(st.integers(0, len(raw)))]
    for bad in (damaged, cut):
        assert _outcome(lambda b=bad: records.scan(b, "t").starts) == _outcome(lambda b=bad: walk(b, "t", 0))
    assert _outcome(lambda: records.scan(damaged, "t").starts) == "corrupt"
