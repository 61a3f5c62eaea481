"""Reading one planned range from replicas that fail, lag or misbehave (fake replicas answering
with stored record bytes, no processes), and the conversions of the source (records -> Arrow)
and of the sink (Arrow -> messages)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import RecordView
from tidelog.dataport_frames import Offsets, PullCall, Pulled
from tidelog.errors import (
    InvalidArgumentError,
    OffsetBelowRetentionError,
    TidelogError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb
from tidelog.spark import rows, sink
from tidelog.spark.fetch import RangeReader
from tidelog.spark.records import Chunk


def record(offset: int, queue: int = 0) -> bytes:
    """The stored bytes of message `offset` of the fake log (key, tags and properties on some)."""
    key = f"k{offset % 5}" if offset % 2 else None
    tags = "x" if offset % 3 == 0 else None
    props = {"n": str(offset)} if offset % 4 == 0 else None
    return rec.encode(
        topic=b"t",
        props=rec.encode_properties(key, tags, props),
        body=f"body-{offset}".encode() + bytes([offset % 256]),
        flags=0,
        queue_id=queue,
        epoch=1,
        queue_offset=offset,
        phys_offset=offset * 100,
        born_ts=1_600_000_000_000,
        store_ts=1_700_000_000_000 + offset,
    )


RAW = [record(i) for i in range(200)]
LOG = [RecordView(r, 0, "a") for r in RAW]


def chunk(lo: int, hi: int) -> Chunk:
    return Chunk.of(b"".join(RAW[lo:hi]), "a")


class FakeReplica:
    """One replica: serves LOG[min:confirmed]; `fail_after` pulls answered, then unreachable."""

    def __init__(
        self,
        confirmed: int = 200,
        min_offset: int = 0,
        fail_after: int | None = None,
        lag_pulls: int = 0,
        gap: bool = False,
        damaged: bool = False,
    ) -> None:
        self.confirmed = confirmed
        self.min = min_offset
        self.fail_after = fail_after
        self.lag_pulls = lag_pulls  # the first pulls see nothing yet (a slave a push behind)
        self.gap = gap
        self.damaged = damaged  # one byte of every reply's last record is flipped
        self.pulls = 0

    def pull(self, call: PullCall) -> Pulled:
        self.pulls += 1
        if self.fail_after is not None and self.pulls > self.fail_after:
            raise UnavailableError("replica down")
        if call.offset < self.min:
            raise OffsetBelowRetentionError(call.offset, self.min)
        offsets = Offsets(self.min, 200, self.confirmed)
        if self.pulls <= self.lag_pulls:
            return Pulled(call.offset, offsets, 0, b"", crc32c(b""))
        # Like a broker: up to max_messages, never past its confirmed offset (but it does not know the range's end).
        stop = min(self.confirmed, call.offset + max(call.max_messages, 1) + (5 if self.gap else 0))
        records = RAW[call.offset + (1 if self.gap else 0) : stop]
        data = b"".join(records)
        crc = crc32c(data)  # what the broker sent; damage below happens on the way
        if self.damaged and data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        return Pulled(call.offset + len(records), offsets, len(records), data, crc)


class FakeClient:
    rpc_timeout = 1.0

    def __init__(self, replicas: dict[str, FakeReplica]) -> None:
        self.replicas = replicas

    async def pull_records(self, address: str, call: PullCall, timeout: float) -> Pulled:
        return self.replicas[address].pull(call)

    async def call_broker(self, address: str, method: str, request: Any, timeout: float | None = None) -> Any:
        replica = self.replicas[address]
        if method == "GetOffsets":
            return bpb.GetOffsetsReply(
                offsets=bpb.QueueOffsets(min=replica.min, max=200, confirmed=replica.confirmed)
            )
        raise AssertionError(method)

    async def route(self, topic: str, refresh: bool = False) -> Any:
        raise UnavailableError("no controller in this test")

    def background(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task


def read_all(replicas: dict[str, FakeReplica], start: int, end: int, **kw: Any) -> tuple[list, RangeReader]:
    reader = RangeReader(FakeClient(replicas), "t", "a", 0, start, end, list(replicas), **kw)  # type: ignore[arg-type]

    async def go() -> list:
        out = []
        while chunk := await reader.next_chunk():
            out.extend(chunk)
        return out

    return asyncio.run(go()), reader


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 150), st.integers(0, 50), st.integers(1, 40), st.integers(0, 6), st.integers(0, 3))
def test_a_replica_failing_at_any_point_gives_the_same_rows(
    start: int, length: int, chunk: int, fail_after: int, lag: int
) -> None:
    end = start + length
    got, reader = read_all(
        {"slave": FakeReplica(fail_after=fail_after, lag_pulls=lag), "master": FakeReplica()},
        start,
        end,
        max_messages=chunk,
    )
    assert got == LOG[start:end]
    assert sum(n for _, _, n in reader.served_by) == length


def test_reads_prefer_the_first_replica_and_never_pass_the_planned_end() -> None:
    slave, master = FakeReplica(), FakeReplica()
    got, reader = read_all({"slave": slave, "master": master}, 10, 55, max_messages=20)
    assert got == LOG[10:55]
    assert [a for a, _, _ in reader.served_by] == ["slave"] * 3 and master.pulls == 0


def test_a_lagging_replica_hands_over_to_one_that_has_the_data() -> None:
    # The slave's confirmed offset is behind the planned end (the master already confirmed 200).
    got, reader = read_all(
        {"slave": FakeReplica(confirmed=30), "master": FakeReplica()}, 0, 100, max_messages=50
    )
    assert got == LOG[:100]
    assert {a for a, _, _ in reader.served_by} == {"slave", "master"}


def test_offsets_that_are_not_contiguous_stop_the_read() -> None:
    with pytest.raises(TidelogError, match="contiguous"):
        read_all({"only": FakeReplica(gap=True)}, 0, 50)


def test_a_damaged_reply_is_read_again_from_another_replica() -> None:
    slave, master = FakeReplica(damaged=True), FakeReplica()
    got, reader = read_all({"slave": slave, "master": master}, 0, 60, max_messages=25)
    assert got == LOG[:60]
    assert {a for a, _, _ in reader.served_by} == {"master"} and slave.pulls >= 1
    with pytest.raises(UnavailableError, match="CRC32C"):
        read_all({"only": FakeReplica(damaged=True)}, 0, 10, timeout=0.5)


def test_no_replica_answering_fails_after_the_read_timeout() -> None:
    with pytest.raises(UnavailableError, match="could not read"):
        read_all({"a": FakeReplica(fail_after=0), "b": FakeReplica(fail_after=0)}, 0, 10, timeout=0.5)


def test_retention_under_a_read_fails_or_skips_ahead() -> None:
    with pytest.raises(OffsetBelowRetentionError):
        read_all({"a": FakeReplica(min_offset=40)}, 10, 60)
    got, _ = read_all({"a": FakeReplica(min_offset=40)}, 10, 60, fail_on_data_loss=False)
    assert got == LOG[40:60]


# --- rows -----------------------------------------------------------------------------------


def test_record_batches_have_exactly_the_types_spark_expects() -> None:
    batch = rows.record_batch(chunk(3, 9), "t", "broker-a", [n for n in rows.ARROW_TYPES])
    assert batch.schema == pa.schema([pa.field(n, t) for n, t in rows.ARROW_TYPES.items()])
    d = batch.to_pylist()
    assert [r["offset"] for r in d] == list(range(3, 9))
    assert {(r["topic"], r["broker_set"], r["queue"]) for r in d} == {("t", "broker-a", 0)}
    assert [r["body"] for r in d] == [m.body for m in LOG[3:9]]
    assert [r["key"] for r in d] == [m.key for m in LOG[3:9]]
    assert [r["tags"] for r in d] == [m.tags for m in LOG[3:9]]
    assert [dict(r["headers"]) for r in d] == [dict(m.properties) for m in LOG[3:9]]
    assert d[0]["timestamp"] == datetime.fromtimestamp(1_700_000_000.003, tz=UTC)


def test_only_the_asked_columns_are_built_in_the_asked_order() -> None:
    batch = rows.record_batch(chunk(0, 4), "t", "a", ["body", "offset"])
    assert batch.schema.names == ["body", "offset"]
    assert rows.tuples(chunk(0, 4), "t", "a", ["body", "offset"]) == [(m.body, m.offset) for m in LOG[:4]]
    with pytest.raises(InvalidArgumentError, match="no column"):
        rows.check_columns(["body", "value"])


def test_tuples_hold_the_same_rows_as_record_batches() -> None:
    names = list(rows.ARROW_TYPES)
    as_arrow = [tuple(r.values()) for r in rows.record_batch(chunk(0, 30), "t", "a", names).to_pylist()]
    as_arrow = [tuple(dict(v) if isinstance(v, list) else v for v in r) for r in as_arrow]
    assert rows.tuples(chunk(0, 30), "t", "a", names) == as_arrow


# --- sink conversion ------------------------------------------------------------------------


def test_sink_rows_become_messages() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "body": pa.array([b"a", b"", b"\x00c"], pa.binary()),
            "key": ["k", None, "k"],
            "tags": [None, "t", None],
            "headers": pa.array([[("h", "1")], None, []], pa.map_(pa.string(), pa.string())),
            "offset": [1, 2, 3],  # columns the sink does not use are ignored
        }
    )
    got = sink.messages_from_batch(batch, "orders")
    assert [(t, m.body, m.key, m.tags, m.properties) for t, m in got] == [
        ("orders", b"a", "k", None, {"h": "1"}),
        ("orders", b"", None, "t", None),
        ("orders", b"\x00c", "k", None, None),
    ]


def test_sink_string_bodies_are_utf8_and_a_topic_column_routes_rows() -> None:
    batch = pa.RecordBatch.from_pydict({"body": ["héllo", "x"], "topic": ["a", "b"]})
    assert [(t, m.body) for t, m in sink.messages_from_batch(batch, None)] == [
        ("a", "héllo".encode()),
        ("b", b"x"),
    ]


@pytest.mark.parametrize(
    "columns,topic,match",
    [
        ({"value": [b"x"]}, "t", "body column"),
        ({"body": [b"x"]}, None, "option topic"),
        ({"body": pa.array([None], pa.binary())}, "t", "null"),
        ({"body": [b"x"], "key": [1]}, "t", "key must be a string"),
    ],
)
def test_sink_rejects_rows_it_cannot_send(columns: dict, topic: str | None, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        sink.messages_from_batch(pa.RecordBatch.from_pydict(columns), topic)


def test_sink_sends_in_bounded_chunks() -> None:
    from tidelog.client import OutMessage

    items = [OutMessage(b"x" * 1000) for _ in range(2500)] + [OutMessage(b"y" * (3 << 20)) for _ in range(3)]
    chunks = list(sink._chunks(items))
    assert sum(len(c) for c in chunks) == len(items)
    assert all(len(c) <= sink.SEND_MAX_MESSAGES for c in chunks)
    assert all(sum(len(m.body) for m in c) <= sink.SEND_MAX_BYTES or len(c) == 1 for c in chunks)


def test_sink_refuses_overwrite_and_rows_without_a_body() -> None:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    with_body = StructType([StructField("body", BinaryType())])
    with pytest.raises(InvalidArgumentError, match="only appends"):
        sink.TidelogWriter({"controllers": "h:1", "topic": "t"}, with_body, True)
    with pytest.raises(InvalidArgumentError, match="body column"):
        sink.TidelogWriter(
            {"controllers": "h:1", "topic": "t"}, StructType([StructField("value", StringType())]), False
        )
    with pytest.raises(InvalidArgumentError, match="option topic"):
        sink.TidelogStreamWriter({"controllers": "h:1"}, with_body, False)
    assert sink.TidelogWriter({"Controllers": "h:1", "TOPIC": "t"}, with_body, False).topic == "t"


def test_later_chunks_are_pulled_while_the_caller_works_on_one() -> None:
    """Read-ahead: after a chunk, the pulls of the next ones are already under way (the replica
    reads and sends them while the caller builds rows); the rows are the same as without."""

    class SlowReplica(FakeReplica):
        def __init__(self) -> None:
            super().__init__()
            self.running = 0
            self.most = 0

    replica = SlowReplica()

    class SlowClient(FakeClient):
        async def pull_records(self, address: str, call: PullCall, timeout: float) -> Pulled:
            replica.running += 1
            replica.most = max(replica.most, replica.running)
            try:
                await asyncio.sleep(0.01)
                return replica.pull(call)
            finally:
                replica.running -= 1

    for ahead, most in ((3, 3), (0, 1)):
        replica.running = replica.most = replica.pulls = 0
        reader = RangeReader(
            SlowClient({"r": replica}), "t", "a", 0, 10, 130, ["r"], max_messages=20, read_ahead=ahead
        )  # type: ignore[arg-type]

        async def go(reader: RangeReader = reader) -> list:
            out = []
            while chunk := await reader.next_chunk():
                out.extend(chunk)
            return out

        rows = asyncio.run(go())
        assert [m.offset for m in rows] == list(range(10, 130))
        assert [m.body for m in rows] == [m.body for m in LOG[10:130]]
        assert replica.most == most
        assert replica.pulls == 6  # every pull was used: none repeated, none wasted
