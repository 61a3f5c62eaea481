"""Record batches (commitlog/FORMAT.md "Record batches"): a producer's encoding, the broker's checks
and stamping, reads of stored bytes and their lazy decoding agree with the one record codec."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog
from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import RecordView, check_batch, cut_batch, encode_batch, walk
from tidelog.errors import CorruptRecordError, InvalidArgumentError, MessageTooLargeError


@dataclass(frozen=True)
class Out:
    body: bytes
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None


values = st.text(max_size=20)
outs = st.builds(
    Out,
    body=st.binary(max_size=300),
    key=st.none() | values,
    tags=st.none() | values,
    properties=st.none()
    | st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in rec.RESERVED_PROPERTIES), values, max_size=3
    ),
)


def _open(tmp_path, **kw) -> CommitLog:
    return CommitLog.open(str(tmp_path), **kw)


@settings(max_examples=60, deadline=None)
@given(st.lists(outs, min_size=1, max_size=20), st.integers(0, 3))
def test_what_a_producer_encodes_is_read_back_field_for_field(tmp_path_factory, batch, queue):
    log = _open(tmp_path_factory.mktemp("log"))
    try:
        data = bytearray(encode_batch(b"orders", queue, batch, 1234))
        first, phys = log.append_encoded("orders", queue, data, len(batch))
        log.confirm_offset = log.max_offset
        stored = log.read("orders", queue, first, len(batch))
        raw, count = log.read_encoded("orders", queue, first, len(batch), 1 << 20)
    finally:
        log.close()
    assert count == len(batch) and [m.phys_offset for m in stored] == phys
    views = [RecordView(raw, pos, "bs") for pos in walk(raw, "test", phys[0])]
    for out, m, v in zip(batch, stored, views, strict=True):
        assert (m.body, m.key, m.tags, m.properties or {}) == (
            out.body,
            out.key,
            out.tags,
            out.properties or {},
        )
        assert (v.body, v.key, v.tags, dict(v.properties)) == (
            out.body,
            out.key,
            out.tags,
            out.properties or {},
        )
        assert (v.topic, v.queue, v.offset, v.phys_offset) == ("orders", queue, m.queue_offset, m.phys_offset)
        assert (v.born_ts, v.store_ts) == (1234, m.store_ts) and m.born_ts == 1234


def test_stored_bytes_are_the_producers_bytes_stamped(tmp_path):
    log = _open(tmp_path)
    sent = encode_batch(b"t", 0, [Out(b"a" * 10), Out(b"b", key="k")], 7)
    data = bytearray(sent)
    log.append_encoded("t", 0, data, 2)
    on_disk = log.read_raw(0, 1 << 20)
    log.close()
    assert on_disk == bytes(data)
    for pos in walk(on_disk, "t", 0):  # only the broker's fields and the CRC differ
        size = struct.unpack_from(">I", on_disk, pos)[0]
        assert on_disk[pos + 64 : pos + size] == sent[pos + 64 : pos + size]
        assert on_disk[pos + 12 : pos + 16] == sent[pos + 12 : pos + 16]  # flags, topic length
        assert rec.check_at(on_disk, pos)[0] == rec.VALID


def test_a_batch_that_crosses_a_segment_end_is_split_by_a_blank_marker(tmp_path):
    log = _open(tmp_path, segment_bytes=4096)
    batch = [Out(bytes([i]) * 700) for i in range(12)]
    first, phys = log.append_encoded("t", 0, bytearray(encode_batch(b"t", 0, batch, 1)), len(batch))
    log.confirm_offset = log.max_offset
    got = log.read("t", 0, first, 100)
    log.close()
    assert [m.body for m in got] == [o.body for o in batch]
    assert all(p // 4096 == (p + 700 + 65) // 4096 for p in phys)  # no record spans two segments
    assert phys[-1] >= 4096 * 2


BAD = {
    "flags set": (lambda b: b[:12] + b"\x00\x01" + b[14:], InvalidArgumentError),
    "another queue": (lambda b: b[:16] + b"\x00\x00\x00\x09" + b[20:], InvalidArgumentError),
    "cut short": (lambda b: b[:-3], InvalidArgumentError),
    "size off by one": (lambda b: struct.pack(">I", len(b) + 1) + b[4:], InvalidArgumentError),
    "bad magic": (lambda b: b[:4] + b"\x00\x00\x00\x00" + b[8:], InvalidArgumentError),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_record_refuses_the_whole_batch_and_writes_nothing(tmp_path, case):
    log = _open(tmp_path)
    good = encode_batch(b"t", 0, [Out(b"x" * 50)], 1)
    damage, error = BAD[case]
    with pytest.raises(error):
        log.append_encoded("t", 0, bytearray(good + damage(good)), 2)
    assert log.max_offset == 0 and log.queue_offsets("t", 0).max == 0
    log.close()


def test_another_topic_count_mismatch_and_oversize_are_refused(tmp_path):
    one = encode_batch(b"u", 0, [Out(b"x")], 1)
    with pytest.raises(InvalidArgumentError, match="another topic"):
        check_batch(one, b"t", 0, 1, 1 << 20)
    two = encode_batch(b"t", 0, [Out(b"x"), Out(b"y")], 1)
    with pytest.raises(InvalidArgumentError, match="not the 3"):
        check_batch(two, b"t", 0, 3, 1 << 20)
    with pytest.raises(MessageTooLargeError):
        check_batch(encode_batch(b"t", 0, [Out(b"x" * 500)], 1), b"t", 0, 1, 200)


def test_a_damaged_byte_in_a_pulled_run_is_named(tmp_path):
    log = _open(tmp_path)
    log.append_encoded("t", 0, bytearray(encode_batch(b"t", 0, [Out(b"abc")] * 3, 1)), 3)
    raw = bytearray(log.read_raw(0, 1 << 20))
    log.close()
    raw[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        walk(bytes(raw), "pull reply", 0)


def test_reads_of_stored_bytes_stop_at_the_confirm_offset_and_the_byte_limit(tmp_path):
    log = _open(tmp_path)
    first, phys = log.append_encoded("t", 0, bytearray(encode_batch(b"t", 0, [Out(b"z" * 100)] * 10, 1)), 10)
    assert log.read_encoded("t", 0, 0, 100, 1 << 20) == (b"", 0)  # nothing confirmed yet
    log.confirm_offset = phys[5]  # records 0..4 end at or below it
    assert log.read_encoded("t", 0, 0, 100, 1 << 20)[1] == 5
    log.confirm_offset = log.max_offset
    size = phys[1] - phys[0]
    assert log.read_encoded("t", 0, 0, 100, size * 3 + 1)[1] == 3
    assert log.read_encoded("t", 0, 0, 100, 1)[1] == 1  # at least one record
    assert log.read_encoded("t", 0, 8, 100, 1 << 20)[1] == 2
    log.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(100, 5000))
def test_raw_chunks_cut_at_remembered_append_ends_replicate_the_log_exactly(
    tmp_path_factory, batches, max_bytes
):
    """The HA sender's reads stop where appends ended instead of walking every record: every chunk
    is still whole records (or one blank marker) within the limit, which a slave's checks accept,
    and the copy is byte for byte the log."""
    log = _open(tmp_path_factory.mktemp("master"), segment_bytes=4096)
    copy = _open(tmp_path_factory.mktemp("slave"), segment_bytes=4096)
    try:
        for n in batches:
            log.append_encoded("t", 0, bytearray(encode_batch(b"t", 0, [Out(b"r" * 90)] * n, 1)), n)
        at = 0
        while at < log.max_offset:
            data, nxt = log.read_raw_chunk(at, max_bytes)
            assert len(data) <= max(max_bytes, 155)  # a record alone may exceed the limit
            at = copy.append_raw(at, data)  # checks every record, and blank markers
            assert at == nxt
        assert copy.max_offset == log.max_offset
        assert _all_bytes(copy) == _all_bytes(log)
        assert [m.body for m in copy.read("t", 0, 0, 1000, confirmed_only=False)] == [b"r" * 90] * sum(
            batches
        )
    finally:
        log.close()
        copy.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(100, 5000))
def test_a_raw_span_locates_exactly_the_chunk_a_raw_read_returns(tmp_path_factory, batches, max_bytes):
    """`raw_span` (what the HA sender hands to sendfile) names the same bytes and the same next
    offset as `read_raw_chunk` wherever it answers, and it answers exactly when an append ended
    within reach of the read (in its segment, within the limit): then no record is walked."""
    seg = 4096
    log = _open(tmp_path_factory.mktemp("master"), segment_bytes=seg)
    copy = _open(tmp_path_factory.mktemp("slave"), segment_bytes=seg)
    try:
        ends = []
        for n in batches:
            log.append_encoded("t", 0, bytearray(encode_batch(b"t", 0, [Out(b"r" * 90)] * n, 1)), n)
            ends.append(log.max_offset)
        at = 0
        while at < log.max_offset:
            data, nxt = log.read_raw_chunk(at, max_bytes)
            span = log.raw_span(at, max_bytes)
            reach = min(at + max(max_bytes, rec.HEADER_SIZE), (at // seg + 1) * seg - 1)
            assert (span is not None) == any(at < e <= reach for e in ends)
            if span is not None:
                assert os.pread(span.fd, span.length, span.position) == data
                assert span.next_offset == nxt
            at = copy.append_raw(at, data)
        assert log.raw_span(log.max_offset, max_bytes) is None
        assert _all_bytes(copy) == _all_bytes(log)
    finally:
        log.close()
        copy.close()


def _all_bytes(log: CommitLog) -> bytes:
    """Every record and blank marker of a log, in order (read as the HA sender reads)."""
    out, at = [], 0
    while at < log.max_offset:
        data, at = log.read_raw_chunk(at, 1 << 20)
        out.append(data)
    return b"".join(out)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40), st.integers(400, 3000), st.integers(1, 8))
def test_a_batch_is_cut_into_whole_records_within_both_limits(bodies, max_bytes, max_records):
    data = encode_batch(b"t", 0, [Out(b) for b in bodies], 1)
    parts = cut_batch(data, len(bodies), max_bytes, max_records)
    assert b"".join(data[s:e] for s, e, _ in parts) == data  # in order, nothing left out
    assert sum(n for _, _, n in parts) == len(bodies)
    for s, e, n in parts:
        assert e - s <= max_bytes and 1 <= n <= max_records
        assert len(walk(data[s:e], "part", 0, verify_crc=False)) == n
    if len(data) <= max_bytes and len(bodies) <= max_records:
        assert parts == [(0, len(data), len(bodies))]


def test_a_record_larger_than_one_part_refuses_the_cut():
    data = encode_batch(b"t", 0, [Out(b"a"), Out(b"b" * 1000), Out(b"c")], 1)
    with pytest.raises(MessageTooLargeError, match="record 1 of the batch"):
        cut_batch(data, 3, 500, 10)
