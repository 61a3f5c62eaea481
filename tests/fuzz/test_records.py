"""Fuzzing the commit-log record decoders (commitlog/record.py, commitlog/batch.py,
commitlog/replication.py) and the C loops that stand in for them (commitlog/_speedups.c).

Contract, on any bytes:
- `check_at` classifies every position without raising, and a record it calls VALID decodes
  (`decode`, `decode_header`) without raising;
- `walk` returns the start of every record or raises CorruptRecordError naming the place and an
  offset inside the bytes; the broker's `check_batch` returns the records or raises
  InvalidArgumentError / MessageTooLargeError; the slave's `_split` returns spans or raises
  CorruptRecordError / OffsetMismatchError;
- each C function returns exactly what its Python twin returns, or None where the twin raises.
  Both twins are called on every input here, so one run covers both paths (what
  `TIDELOG_PURE_PYTHON=1` switches for a whole process).

The seeds are records laid out by the real encoder with arbitrary field values (topics and
properties that are not UTF-8 included: only their CRC makes them records), producer batches,
and segment tails (a blank marker, zeros).
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import FUZZ, Fuzzer, inputs, plain
from tidelog.client.aio import OutMessage
from tidelog.commitlog import batch, replication, speedups
from tidelog.commitlog import record as rec
from tidelog.errors import CorruptRecordError, InvalidArgumentError, MessageTooLargeError, OffsetMismatchError

C = speedups._native  # the module itself (None where it was not built), whatever `use` chose
SEG = 4096
KINDS = {rec.VALID, rec.IS_BLANK, rec.END, rec.DAMAGED}

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
names = st.text(min_size=1, max_size=8).filter(lambda k: k not in rec.RESERVED_PROPERTIES)
good_props = st.builds(
    rec.encode_properties,
    st.none() | st.text(max_size=8),
    st.none() | st.text(max_size=8),
    st.none() | st.dictionaries(names, st.text(max_size=8), max_size=3),
)
props = st.one_of(good_props, st.binary(max_size=24))
topics = st.one_of(st.text(min_size=1, max_size=12).map(str.encode), st.binary(max_size=12))


@st.composite
def records(draw: st.DrawFn, phys: int = 0) -> bytes:
    return rec.encode(
        topic=draw(topics),
        props=draw(props),
        body=draw(st.binary(max_size=64)),
        flags=draw(st.integers(0, 0xFFFF)),
        queue_id=draw(u32),
        epoch=draw(u32),
        queue_offset=draw(u64),
        phys_offset=phys if draw(st.booleans()) else draw(u64),
        born_ts=draw(u64),
        store_ts=draw(u64),
    )


@st.composite
def stored(draw: st.DrawFn) -> bytes:
    """Records back to back as a log holds them (each naming its own offset), and maybe a tail."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        out += draw(records(phys=len(out)))
    tail = draw(st.sampled_from([b"", b"\0" * 8, rec.blank_marker(SEG - len(out) % SEG)]))
    return out + tail


messages = st.builds(
    OutMessage,
    st.binary(max_size=40),
    st.none() | st.text(max_size=6),
    st.none() | st.text(max_size=6),
    st.none(),
)
producer_batches = st.builds(
    lambda topic, msgs, born: batch.encode_batch(topic, 7, msgs, born),
    st.text(min_size=1, max_size=8).map(str.encode),
    st.lists(messages, min_size=1, max_size=4),
    st.integers(0, 2**63 - 1),
)
seeds = st.one_of(stored(), producer_batches)


def _outcome(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return "ok", fn(*args)
    except (CorruptRecordError, InvalidArgumentError, MessageTooLargeError, OffsetMismatchError) as exc:
        return "raised", exc


def _check_classify(data: bytes, starts: list[int]) -> None:
    for pos in {0, *starts}:
        kind, size, reason = rec.check_at(data, pos)
        assert kind in KINDS and (kind != rec.DAMAGED or reason)
        if kind == rec.VALID:
            assert rec.HEADER_SIZE <= size <= len(data) - pos
            rec.decode_header(data, pos)
            m = rec.decode(data, pos)
            assert m.size == size


def _walk_py(data: bytes, verify: bool) -> tuple[str, object]:
    before, speedups.native = speedups.native, None
    try:
        return _outcome(batch.walk, data, "fuzz", 1000, verify)
    finally:
        speedups.native = before


def _check_walk(data: bytes) -> list[int]:
    starts: list[int] = []
    for verify in (True, False):
        want = _walk_py(data, verify)
        if want[0] == "raised":
            err = want[1]
            assert isinstance(err, CorruptRecordError), err
            assert err.path == "fuzz" and 1000 <= err.offset < 1000 + len(data), err
        elif verify:
            starts = want[1]  # type: ignore[assignment]
        if C is not None:
            got = C.walk(data, verify)
            assert (got is None and want[0] == "raised") or ("ok", got) == want, (got, want)
    return starts


def _check_batch(data: bytes) -> None:
    """The broker's check of a producer batch, with the topic, queue and count the bytes suggest."""
    if len(data) < rec.HEADER_SIZE:
        return
    tlen, qid = struct.unpack_from(">HI", data, 14)
    topic = data[rec.HEADER_SIZE : rec.HEADER_SIZE + tlen]
    for count in (1, 2, 3):
        want = _outcome(batch._check_batch_py, data, topic, qid, count, 1 << 20)
        assert want[0] == "ok" or isinstance(want[1], InvalidArgumentError | MessageTooLargeError), want
        if C is not None:
            got = C.check_batch(data, topic, qid, count, 1 << 20)
            assert (got is None and want[0] == "raised") or ("ok", got) == want, (got, want)


def _check_split(data: bytes) -> None:
    """The slave's check of bytes from its master, landing at offset 0 of a segment."""

    def python():  # type: ignore[no-untyped-def]
        spans, units, end = replication._split(data, 0, SEG)
        return spans, replication._runs(data, units), end

    want = _outcome(python)
    if C is not None:
        got = C.split_raw(data, 0, SEG)
        assert (got is None and want[0] == "raised") or ("ok", got) == want, (got, want)
    if want[0] == "ok":
        # what append_raw checks of either twin's runs before writing
        _outcome(replication._topics, want[1][1])  # type: ignore[index]


def check_records(data: bytes) -> None:
    starts = _check_walk(data)
    _check_classify(data, starts)
    _check_batch(data)
    _check_split(data)


FUZZERS = [Fuzzer("commitlog.records", seeds, plain(check_records))]


@FUZZ
@given(inputs(seeds))
def test_record_decoders(data: bytes) -> None:
    check_records(data)
