"""The record codec: round trips, every damaged byte is detected, and the log writes exactly the
bytes FORMAT.md documents."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog import record as rec

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-%", min_size=1, max_size=40)
values = st.text(max_size=30)
props_st = st.dictionaries(
    st.text(min_size=1, max_size=12).filter(lambda k: k not in rec.RESERVED_PROPERTIES), values, max_size=4
)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**63 - 1)


@st.composite
def records(draw):
    fields = dict(
        topic=draw(names).encode(),
        body=draw(st.binary(max_size=600)),
        flags=draw(st.integers(0, 2**16 - 1)),
        queue_id=draw(u32),
        epoch=draw(u32),
        queue_offset=draw(u64),
        phys_offset=draw(u64),
        born_ts=draw(u64),
        store_ts=draw(u64),
    )
    key = draw(st.none() | values)
    tags = draw(st.none() | values)
    props = draw(props_st)
    fields["props"] = rec.encode_properties(key, tags, props)
    return fields, key, tags, props


@settings(max_examples=200, deadline=None)
@given(records())
def test_round_trip(case):
    fields, key, tags, props = case
    data = rec.encode(**fields)
    assert rec.check_at(data, 0) == (rec.VALID, len(data), "")
    m = rec.decode(data)
    assert (
        m.topic.encode(),
        m.body,
        m.flags,
        m.queue_id,
        m.epoch,
        m.queue_offset,
        m.phys_offset,
        m.born_ts,
        m.store_ts,
    ) == (
        fields["topic"],
        fields["body"],
        fields["flags"],
        fields["queue_id"],
        fields["epoch"],
        fields["queue_offset"],
        fields["phys_offset"],
        fields["born_ts"],
        fields["store_ts"],
    )
    assert (m.key, m.tags, m.properties) == (key, tags, props)
    assert m.size == len(data)


@settings(max_examples=200, deadline=None)
@given(records(), st.data())
def test_any_flipped_byte_is_detected(case, data):
    encoded = bytearray(rec.encode(**case[0]))
    i = data.draw(st.integers(0, len(encoded) - 1))
    bit = data.draw(st.integers(0, 7))
    encoded[i] ^= 1 << bit
    kind, _, reason = rec.check_at(encoded, 0)
    # The only byte flips that are not DAMAGED turn the size/magic into a blank marker or
    # "end of data"; none of them may pass as a valid record.
    assert kind != rec.VALID
    if kind == rec.DAMAGED:
        assert reason


def test_blank_marker_and_end_of_data():
    assert rec.check_at(rec.blank_marker(4096), 0) == (rec.IS_BLANK, 4096, "")
    assert rec.check_at(bytes(100), 0)[0] == rec.END
    assert rec.check_at(b"", 0)[0] == rec.END
    assert rec.check_at(b"\x01\x02", 0)[0] == rec.DAMAGED


def test_truncated_record_is_damaged_not_end():
    data = rec.encode(
        topic=b"t",
        props=b"",
        body=b"x" * 100,
        flags=0,
        queue_id=0,
        epoch=0,
        queue_offset=0,
        phys_offset=0,
        born_ts=0,
        store_ts=0,
    )
    kind, _, reason = rec.check_at(data[:-1], 0)
    assert kind == rec.DAMAGED and "runs past" in reason


@pytest.mark.parametrize("name", sorted(rec.RESERVED_PROPERTIES))
def test_reserved_property_names_are_refused(name):
    with pytest.raises(ValueError, match="reserved"):
        rec.encode_properties(None, None, {name: "x"})


def test_tags_hash_is_stable_and_nonzero():
    assert rec.tags_hash(None) == 0
    assert rec.tags_hash("TagA") == rec.tags_hash("TagA") != 0
    assert rec.tags_of(rec.encode_properties("k", "TagA", {"x": "y"})) == "TagA"


def test_the_log_writes_the_documented_bytes(tmp_path) -> None:
    """A record the append path wrote, rebuilt field by field from commitlog/FORMAT.md."""
    log = CommitLog.open(tmp_path, segment_bytes=1 << 16)
    log.epochs.append(7, 0)
    msg = Message("tp", 3, b"body", key="k", tags="tg", properties={"a": "b"}, flags=2, born_ts=111)
    (placed,) = log.append([msg], now_ms=222)
    written = log.read_raw(0, 1 << 16)
    log.close()
    props = (
        struct.pack(">H", 4)
        + b"KEYS"
        + struct.pack(">I", 1)
        + b"k"
        + struct.pack(">H", 4)
        + b"TAGS"
        + struct.pack(">I", 2)
        + b"tg"
        + struct.pack(">H", 1)
        + b"a"
        + struct.pack(">I", 1)
        + b"b"
    )
    size = 64 + 2 + len(props) + 4
    covered = struct.pack(">HHIIQQQQII", 2, 2, 3, 7, 0, 0, 111, 222, len(props), 4) + b"tp" + props + b"body"
    assert written == struct.pack(">III", size, 0x7DE10601, crc32c(covered)) + covered
    assert placed == (0, 0, size)
