"""Lookups on a real commit log: by queue offset, by message id (physical offset), by key.

The key index (commitlog/FORMAT.md "Key index") is checked the way a broker relies on it: every
confirmed keyed message is found, newest first, with hash collisions filtered by the record's own
key; the index survives a reopen, is repaired and extended after a crash that lost its tail, is
rebuilt when its file is damaged, follows truncation and retention, and is the same on a replica
that copied the log's bytes. Ids from outside never read anything but a message where it starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog import keyformat as kf
from tidelog.commitlog import record as rec
from tidelog.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    OffsetBelowRetentionError,
)

SEG = 8192
NEVER = 10**9


def open_log(path: Path, **kw: object) -> CommitLog:
    kw.setdefault("segment_bytes", SEG)
    kw.setdefault("flush_interval_ms", NEVER)
    kw.setdefault("checkpoint_interval_ms", NEVER)
    kw.setdefault("cq_units_per_file", 16)
    kw.setdefault("key_index_slots", 8)  # few slots: chains share them
    kw.setdefault("key_index_entries", 10)  # small files: lookups cross several
    return CommitLog.open(path, **kw)  # type: ignore[arg-type]


def keyed(n: int, *, start: int = 0, keys: int = 5, topic: str = "t", queues: int = 2) -> list[Message]:
    return [
        Message(topic, i % queues, b"body-%d" % i, key=f"k{i % keys}", tags="x" if i % 3 else None)
        for i in range(start, start + n)
    ]


def bodies(found: list[bytes]) -> list[bytes]:
    return [rec.decode(d).body for d in found]


def find(log: CommitLog, key: str, topic: str = "t", **kw: int) -> list[bytes]:
    return bodies(log.find_by_key(topic, key, **kw)[0])


def expected(written: list[Message], key: str, topic: str = "t") -> list[bytes]:
    """Bodies of the written messages with `key`, newest first."""
    return [m.body for m in reversed(written) if m.key == key and m.topic == topic]


def index_files(log: CommitLog) -> list[Path]:
    return sorted((Path(log.directory) / "index").iterdir())


@pytest.fixture
def log(tmp_path: Path):
    lg = open_log(tmp_path / "log")
    yield lg
    lg.close()


# --- the codec ---------------------------------------------------------------------------------

u32 = st.integers(0, (1 << 32) - 1)
u63 = st.integers(0, (1 << 63) - 1)


@given(
    slots=st.integers(1, kf.MAX_SLOTS),
    capacity=st.integers(1, kf.MAX_CAPACITY),
    used=st.integers(0, kf.MAX_CAPACITY),
    begin=u63,
    span=st.integers(0, 1 << 40),
    first=u63,
    last=u63,
    flags=st.sampled_from([0, kf.CLEAN]),
)
def test_header_round_trips(slots, capacity, used, begin, span, first, last, flags):
    h = kf.Header(
        slots, capacity, min(used, capacity), begin, min(begin + span, (1 << 64) - 1), first, last, flags
    )
    data = kf.encode_header(h)
    assert len(data) == kf.HEADER_BYTES
    assert kf.decode_header(data) == h


@given(st.binary(min_size=0, max_size=80))
def test_any_bytes_are_a_header_or_header_damaged(data):
    with contextlib.suppress(kf.HeaderDamaged):
        kf.decode_header(data)


@given(
    data=st.binary(min_size=kf.HEADER_BYTES, max_size=kf.HEADER_BYTES), at=st.integers(0, kf.HEADER_BYTES - 1)
)
def test_a_flipped_header_byte_is_damage(data, at):
    good = kf.encode_header(kf.Header(8, 10, 3, 100, 200, 5, 6))
    bad = bytearray(good)
    bad[at] ^= 0xFF
    if at < kf.HEADER.size + 4:  # the fields and their CRC; the spare bytes are not read
        with pytest.raises(kf.HeaderDamaged):
            kf.decode_header(bytes(bad))


@given(u32, u32, u63, u63)
def test_entry_round_trips(key_hash, prev, phys, ts):
    e = kf.Entry(key_hash, prev, phys, ts)
    data = kf.encode_entry(e)
    assert len(data) == kf.ENTRY_BYTES
    assert kf.decode_entry(b"xx" + data, 2) == e


@given(
    key=st.one_of(st.none(), st.text(min_size=0, max_size=40)),
    tags=st.one_of(st.none(), st.text(max_size=10)),
    props=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda s: s not in rec.RESERVED_PROPERTIES),
        st.text(max_size=8),
        max_size=3,
    ),
)
def test_the_key_comes_back_from_an_encoded_properties_block(key, tags, props):
    block = rec.encode_properties(key, tags, props)
    assert kf.key_in_properties(block) == (key.encode() if key else None)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["t", "u", "%OFFSETS%"]),
            st.one_of(st.none(), st.text(min_size=1, max_size=12)),
            st.integers(0, 2),
        ),
        max_size=20,
    )
)
@settings(max_examples=50)
def test_index_entries_names_every_keyed_user_message_of_a_chunk(records):
    at = 4096
    parts, want, pos = [], [], at
    for i, (topic, key, flags) in enumerate(records):
        props = rec.encode_properties(key, None, None)
        data = rec.encode(
            topic=topic.encode(),
            props=props,
            body=b"b%d" % i,
            flags=flags,
            queue_id=0,
            epoch=1,
            queue_offset=i,
            phys_offset=pos,
            born_ts=1,
            store_ts=1000 + i,
        )
        if key and not flags and not topic.startswith("%"):
            want.append((kf.key_hash(topic.encode(), key.encode()), pos, 1000 + i))
        parts.append(data)
        pos += len(data)
    chunk = b"".join(parts) + rec.blank_marker(64)
    assert kf.index_entries(chunk, at) == want


@given(st.text(alphabet="abcdef-_.0123456789", min_size=1, max_size=30), u63)
def test_message_ids_round_trip(broker_set, phys):
    assert kf.parse_message_id(kf.format_message_id(broker_set, phys)) == (broker_set, phys)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "broker-a",
        "broker-a:",
        ":10",
        "broker-a:xyz",
        "broker-a:-1",
        "a:b:c",
        "broker-a:10 ",
        "broker-a:" + "f" * 17,
        "a:FF",
    ],
)
def test_malformed_message_ids_are_refused(bad):
    assert kf.parse_message_id(bad) is None


# --- lookups by key --------------------------------------------------------------------------------


def test_every_confirmed_keyed_message_is_found_newest_first(log):
    written = keyed(120)
    log.append(written)
    log.append([Message("u", 0, b"other topic", key="k1"), Message("t", 0, b"no key")])
    log.confirm_offset = log.max_offset
    for k in range(5):
        assert find(log, f"k{k}") == expected(written, f"k{k}")
    assert find(log, "k1", topic="u") == [b"other topic"]
    assert find(log, "nope") == []
    assert len(index_files(log)) > 3  # the lookups crossed several sealed files


def test_limits_and_the_more_flag(log):
    written = keyed(60, keys=2)
    log.append(written)
    log.confirm_offset = log.max_offset
    found, more = log.find_by_key("t", "k0", max_results=4)
    assert bodies(found) == expected(written, "k0")[:4] and more
    found, more = log.find_by_key("t", "k0", max_results=1000)
    assert bodies(found) == expected(written, "k0") and not more
    one = len(found[0])
    found, more = log.find_by_key("t", "k0", max_bytes=one + 1)
    assert len(found) == 1 and more
    found, _ = log.find_by_key("t", "k0", max_bytes=1)  # at least one
    assert len(found) == 1


def test_time_range_selects_by_store_time(tmp_path):
    now = [1_000_000.0]
    lg = open_log(tmp_path / "log", clock=lambda: now[0])
    try:
        early = keyed(20)
        lg.append(early)
        now[0] += 100
        late = keyed(20, start=20)
        lg.append(late)
        lg.confirm_offset = lg.max_offset
        cut = 1_000_050_000
        assert find(lg, "k2", end_ts=cut) == expected(early, "k2")
        assert find(lg, "k2", begin_ts=cut) == expected(late, "k2")
        assert find(lg, "k2") == expected(early + late, "k2")
    finally:
        lg.close()


def test_unconfirmed_messages_are_not_found(log):
    first = keyed(10)
    log.append(first)
    log.confirm_offset = log.max_offset
    log.append(keyed(10, start=10))
    assert find(log, "k3") == expected(first, "k3")


def test_hash_collisions_are_filtered_by_the_records_own_key(log, monkeypatch):
    # every key hashes alike: only the records' own topic and key tell them apart
    monkeypatch.setattr(kf, "key_hash", lambda topic, key: 7)
    written = keyed(40, keys=4) + [Message("u", 0, b"u-k1", key="k1")]
    log.append(written)
    log.confirm_offset = log.max_offset
    for k in range(4):
        assert find(log, f"k{k}") == expected(written, f"k{k}")
    assert find(log, "k1", topic="u") == [b"u-k1"]


def test_bad_key_lookups_are_refused(log):
    for kw in ({"key": ""}, {"key": "x" * (33 * 1024)}, {"key": "k", "begin_ts": 5, "end_ts": 4}):
        with pytest.raises(InvalidArgumentError):
            log.find_by_key("t", **kw)
    with pytest.raises(InvalidArgumentError):
        log.find_by_key("no/such", "k")
    with pytest.raises(InvalidArgumentError):
        log.find_by_key("t", "k", max_results=0)


# --- persistence, crashes, damage ----------------------------------------------------------------


def test_the_index_survives_a_reopen_without_a_rebuild(tmp_path):
    lg = open_log(tmp_path / "log")
    written = keyed(80)
    lg.append(written)
    lg.confirm_offset = lg.max_offset
    lg.index_keys()
    end = lg.max_offset
    lg.close()
    lg = open_log(tmp_path / "log")
    try:
        assert lg._core.keys.end_phys == end  # nothing to index again
        for k in range(5):
            assert find(lg, f"k{k}") == expected(written, f"k{k}")
    finally:
        lg.close()


def _crash_losing_the_index_tail(tmp_path: Path, *, garbage: bool) -> tuple[Path, list[Message]]:
    """A log whose last index file went back to an earlier synced header: its slots name entries
    the header does not count (and, with `garbage`, those entries are noise)."""
    lg = open_log(tmp_path / "log", key_index_entries=1000)
    written = keyed(30)
    lg.append(written)
    lg.index_keys()
    (last,) = index_files(lg)
    old_header = last.read_bytes()[: kf.HEADER_BYTES]
    more = keyed(30, start=30)
    lg.append(more)
    lg.index_keys()
    lg.close()
    data = bytearray(last.read_bytes())
    data[: kf.HEADER_BYTES] = old_header
    if garbage:
        start = kf.entry_position(8, 31)
        data[start:] = os.urandom(len(data) - start)
    last.write_bytes(bytes(data))
    return tmp_path / "log", written + more


@pytest.mark.parametrize("garbage", [False, True])
def test_a_crash_that_lost_the_index_tail_is_repaired_and_extended(tmp_path, garbage, caplog):
    path, written = _crash_losing_the_index_tail(tmp_path, garbage=garbage)
    with caplog.at_level(logging.INFO, logger="tidelog.commitlog.keyindex"):
        lg = open_log(path, key_index_entries=1000)
    try:
        assert re.search(r"not closed cleanly: [1-9][0-9]* slot\(s\) repaired", caplog.text)
        lg.confirm_offset = lg.max_offset
        for k in range(5):
            assert find(lg, f"k{k}") == expected(written, f"k{k}")  # each once, none lost
    finally:
        lg.close()


def test_a_damaged_index_file_is_rebuilt_from_the_log(tmp_path, caplog):
    lg = open_log(tmp_path / "log")
    written = keyed(60)
    lg.append(written)
    lg.index_keys()
    files = index_files(lg)
    lg.close()
    victim = files[1]
    victim.write_bytes(b"\xff" * 64 + victim.read_bytes()[64:])
    with caplog.at_level(logging.WARNING):
        lg = open_log(tmp_path / "log")
    try:
        assert "damaged" in caplog.text and "rebuilt from the log" in caplog.text
        lg.confirm_offset = lg.max_offset
        for k in range(5):
            assert find(lg, f"k{k}") == expected(written, f"k{k}")
    finally:
        lg.close()


def test_an_index_directory_of_nonsense_does_not_stop_the_open(tmp_path):
    lg = open_log(tmp_path / "log")
    written = keyed(30)
    lg.append(written)
    lg.close()
    index = tmp_path / "log" / "index"
    shutil.rmtree(index)
    index.mkdir()
    (index / ("0" * 20)).write_bytes(os.urandom(300))
    lg = open_log(tmp_path / "log")
    try:
        lg.confirm_offset = lg.max_offset
        assert find(lg, "k4") == expected(written, "k4")
    finally:
        lg.close()


# --- truncation, retention, replicas --------------------------------------------------------------


def test_truncation_drops_index_entries_and_new_records_are_found(log):
    first = keyed(40)
    placed = log.append(first)
    log.append(keyed(40, start=40))
    log.index_keys()
    log.truncate(placed[-1].phys_offset + placed[-1].size)
    again = [Message("t", 0, b"again-%d" % i, key="k1") for i in range(3)]
    log.append(again)
    log.confirm_offset = log.max_offset
    assert find(log, "k1") == [m.body for m in reversed(again)] + expected(first, "k1")


def test_retention_drops_index_files_and_old_entries(log):
    written = keyed(300)
    placed = log.append(written)
    log.confirm_offset = log.max_offset
    log.index_keys()
    before = len(index_files(log))
    new_min = log.delete_before(log.max_offset - 2 * SEG)
    assert new_min > 0
    assert len(index_files(log)) < before
    kept = [m for m, p in zip(written, placed, strict=True) if p.phys_offset >= new_min]
    assert 0 < len(kept) < len(written)
    assert find(log, "k1", max_results=1000) == expected(kept, "k1")


def test_a_replica_that_copied_the_bytes_has_the_same_index(tmp_path):
    master = open_log(tmp_path / "m")
    slave = open_log(tmp_path / "s")
    written = keyed(100)
    master.append(written)
    off = 0
    while off < master.max_offset:
        off = slave.append_raw(off, master.read_raw(off, 3000))
    for lg in (master, slave):
        lg.confirm_offset = lg.max_offset
        assert find(lg, "k2") == expected(written, "k2")
    master.index_keys()
    slave.index_keys()
    mfiles, sfiles = index_files(master), index_files(slave)
    master.close()
    slave.close()
    assert [f.name for f in mfiles] == [f.name for f in sfiles]
    assert [f.read_bytes() for f in mfiles] == [f.read_bytes() for f in sfiles]


# --- by queue offset and by id --------------------------------------------------------------------


def test_get_by_queue_offset(log):
    written = keyed(10)
    log.append(written)
    log.confirm_offset = log.max_offset
    m = rec.decode(log.message_in_queue("t", 1, 2))
    assert (m.body, m.key, m.queue_offset) == (written[5].body, written[5].key, 2)
    with pytest.raises(MessageNotFoundError):
        log.message_in_queue("t", 1, 5)
    with pytest.raises(MessageNotFoundError):
        log.message_in_queue("t", 7, 0)
    with pytest.raises(InvalidArgumentError):
        log.message_in_queue("t", 1, -1)


def test_get_by_id_reads_exactly_the_message_there(log):
    written = keyed(10)
    placed = log.append(written)
    log.confirm_offset = log.max_offset
    for m, p in zip(written, placed, strict=True):
        got = rec.decode(log.message_at(p.phys_offset))
        assert (got.body, got.key, got.phys_offset) == (m.body, m.key, p.phys_offset)


def test_forged_and_stale_ids_get_typed_errors(log):
    written = keyed(5)
    placed = log.append(written)
    # a body holding a well-formed record that claims the very offset it lands at
    at = log.max_offset
    fake_props = rec.encode_properties("k0", None, None)
    prefix = rec.HEADER_SIZE + 1 + len(fake_props)
    inner = rec.encode(
        topic=b"t",
        props=b"",
        body=b"forged",
        flags=0,
        queue_id=0,
        epoch=0,
        queue_offset=0,
        phys_offset=at + prefix,
        born_ts=0,
        store_ts=0,
    )
    (trap,) = log.append([Message("t", 0, inner, key="k0")])
    assert trap.phys_offset == at
    log.append([Message("%OFFSETS%", 0, b"internal")])
    internal = log.max_offset
    log.confirm_offset = log.max_offset
    (unconfirmed,) = log.append([Message("t", 0, b"late")])
    for phys in (
        placed[1].phys_offset + 1,  # inside a record
        at + prefix,  # the record inside the body
        internal - 64 - len("%OFFSETS%") - len(b"internal"),  # a record of tidelog's own
        unconfirmed.phys_offset,  # not confirmed yet
        log.max_offset + 100,  # beyond the log
        SEG - 3,  # a header would cross the segment's end
    ):
        with pytest.raises(MessageNotFoundError):
            log.message_at(phys)
    with pytest.raises(InvalidArgumentError):
        log.message_at(-1)
    assert find(log, "k0") == [inner] + expected(written, "k0")


def test_ids_below_retention_say_so(log):
    placed = log.append(keyed(200))
    log.confirm_offset = log.max_offset
    log.delete_before(log.max_offset - SEG)
    with pytest.raises(OffsetBelowRetentionError):
        log.message_at(placed[0].phys_offset)


def test_a_failed_index_write_is_retried_without_duplicates(log, monkeypatch):
    from tidelog.commitlog import keyindex

    written = keyed(25)
    log.append(written)
    real = keyindex.pwrite_all
    calls = {"n": 0}

    def flaky(fd: int, data: bytes, offset: int) -> None:
        if offset >= kf.entry_position(8, 1) and len(data) % kf.ENTRY_BYTES == 0:
            calls["n"] += 1
            if calls["n"] == 2:  # a full disk: the entries of the second file, after a roll
                raise OSError(28, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(keyindex, "pwrite_all", flaky)
    with pytest.raises(OSError):
        log.index_keys()
    monkeypatch.setattr(keyindex, "pwrite_all", real)
    log.confirm_offset = log.max_offset
    for k in range(5):
        assert find(log, f"k{k}") == expected(written, f"k{k}")
