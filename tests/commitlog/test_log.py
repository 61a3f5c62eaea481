"""CommitLog behaviour: append/read/reopen, truncation, recovery, raw replication, retention.

Each test checks what a user of the log relies on: bytes read back equal bytes written, a torn
tail never costs a flushed record, corruption of flushed data is an error naming file and
offset, readers never pass the confirm offset, replicas are byte-identical.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog import record as rec
from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    MessageTooLargeError,
    OffsetBelowRetentionError,
    OffsetMismatchError,
    StoreClosedError,
)

SEG = 8192
NEVER = 10**9  # a flush interval long enough that only explicit flushes happen


def open_log(path, **kw) -> CommitLog:
    kw.setdefault("segment_bytes", SEG)
    kw.setdefault("flush_interval_ms", NEVER)
    kw.setdefault("checkpoint_interval_ms", NEVER)
    kw.setdefault("cq_units_per_file", 16)
    return CommitLog.open(path, **kw)


def msgs(n, *, seed=0, topics=("a", "b"), queues=3, max_body=400):
    r = random.Random(seed)
    out = []
    for i in range(n):
        body = f"{seed}:{i}:".encode() + r.randbytes(r.randint(0, max_body))
        out.append(
            Message(
                r.choice(topics),
                r.randrange(queues),
                body,
                key=f"k{i}" if i % 2 else None,
                tags="T" if i % 3 == 0 else None,
                properties={"n": str(i)} if i % 5 == 0 else None,
            )
        )
    return out


def read_all(log: CommitLog) -> dict[tuple[str, int], list[rec.StoredMessage]]:
    out = {}
    for topic, queue in log.queues():
        got, off = [], log.queue_offsets(topic, queue).min
        while True:
            batch = log.read(topic, queue, off, 50)
            if not batch:
                break
            got.extend(batch)
            off = batch[-1].queue_offset + 1
        out[(topic, queue)] = got
    return out


def expected_by_queue(messages):
    out: dict[tuple[str, int], list[Message]] = {}
    for m in messages:
        out.setdefault((m.topic, m.queue_id), []).append(m)
    return out


def assert_same(read, messages):
    exp = expected_by_queue(messages)
    assert set(k for k, v in read.items() if v) == set(exp)
    for key, ms in exp.items():
        got = read[key]
        assert [g.body for g in got] == [m.body for m in ms]
        assert [g.key for g in got] == [m.key for m in ms]
        assert [g.tags for g in got] == [m.tags for m in ms]
        assert [g.properties for g in got] == [dict(m.properties or {}) for m in ms]
        assert [g.queue_offset for g in got] == list(
            range(got[0].queue_offset, got[0].queue_offset + len(got))
        )


def confirm_all(log):
    log.confirm_offset = log.max_offset


# --- append and read ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(0, 10**6))
def test_random_batches_survive_reopen_byte_identical(tmp_path_factory, batch_sizes, seed):
    path = tmp_path_factory.mktemp("log")
    written = []
    log = open_log(path)
    for i, n in enumerate(batch_sizes):
        batch = msgs(n, seed=seed + i)
        placed = log.append(batch)
        assert [p.phys_offset for p in placed] == sorted(p.phys_offset for p in placed)
        written.extend(batch)
    confirm_all(log)
    assert_same(read_all(log), written)
    end = log.max_offset
    log.close()
    log = open_log(path)
    assert log.max_offset == end and log.confirm_offset == end
    assert_same(read_all(log), written)
    log.close()


def test_placements_match_records_and_physical_offsets_are_dense(tmp_path):
    log = open_log(tmp_path)
    batch = msgs(120, seed=3)
    placed = log.append(batch)
    confirm_all(log)
    for m, p in zip(batch, placed, strict=True):
        got = log.read_at(p.phys_offset)
        assert (got.body, got.queue_offset, got.size) == (m.body, p.queue_offset, p.size)
    assert len({p.phys_offset // SEG for p in placed}) > 1, "the batch must roll segments"
    log.close()


def test_records_carry_the_last_epoch(tmp_path):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"before")])
    log.epochs.append(7, log.max_offset)
    log.append([Message("t", 0, b"after")])
    confirm_all(log)
    assert [m.epoch for m in log.read("t", 0, 0, 10)] == [0, 7]
    log.close()


def test_reads_never_pass_the_confirm_offset(tmp_path):
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, bytes([i]) * 50) for i in range(10)])
    assert log.read("t", 0, 0, 100) == []
    assert log.queue_offsets("t", 0).confirmed == 0
    # confirm in the middle of record 5: records 0..4 are visible, 5 is not
    log.confirm_offset = placed[5].phys_offset + 10
    got = log.read("t", 0, 0, 100)
    assert [m.queue_offset for m in got] == [0, 1, 2, 3, 4]
    assert log.queue_offsets("t", 0) == (0, 10, 5)
    assert log.read("t", 0, 5, 100) == []
    with pytest.raises(AssertionError):
        log.confirm_offset = log.max_offset + 1
    log.close()


def test_max_bytes_limits_a_read_but_returns_at_least_one(tmp_path):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 300) for _ in range(5)])
    confirm_all(log)
    assert len(log.read("t", 0, 0, 10, max_bytes=10)) == 1
    assert len(log.read("t", 0, 0, 10, max_bytes=800)) == 2
    log.close()


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("bad topic", 0, b"x"), InvalidArgumentError),
        (Message("../x", 0, b"x"), InvalidArgumentError),
        (Message("", 0, b"x"), InvalidArgumentError),
        (Message("t", -1, b"x"), InvalidArgumentError),
        (Message("t", 0, "not bytes"), InvalidArgumentError),
        (Message("t", 0, b"x", properties={"KEYS": "x"}), InvalidArgumentError),
        (Message("t", 0, b"x" * SEG), MessageTooLargeError),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_written(tmp_path, message, error):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"ok")])
    before = log.max_offset
    with pytest.raises(error):
        log.append([Message("t", 0, b"fine"), message])
    assert log.max_offset == before
    assert log.queue_offsets("t", 0).max == 1
    log.append([Message("t", 0, b"after")])  # the refused batch left nothing behind in the queue
    assert [m.queue_offset for m in log.read("t", 0, 0, 10, confirmed_only=False)] == [0, 1]
    assert [m.body for m in log.read("t", 0, 0, 10, confirmed_only=False)] == [b"ok", b"after"]
    log.close()


def test_closed_log_refuses_work(tmp_path):
    log = open_log(tmp_path)
    log.close()
    with pytest.raises(StoreClosedError):
        log.append([Message("t", 0, b"x")])


# --- group commit ---------------------------------------------------------------------------


def test_sync_flush_resolves_only_after_fdatasync_covers_the_record(tmp_path):
    log = open_log(tmp_path, flush="sync")

    async def writer(i):
        placed = log.append([Message("t", i % 4, b"x" * 100)])
        end = placed[-1].phys_offset + placed[-1].size
        await log.flushed(end)
        assert log.flushed_offset >= end
        return end

    async def main():
        return await asyncio.gather(*(writer(i) for i in range(64)))

    ends = asyncio.run(main())
    assert log.flushed_offset >= max(ends)
    log.close()


def test_a_sync_write_is_released_by_its_fdatasync_not_by_the_checkpoint_after_it(tmp_path, monkeypatch):
    """The checkpoint is a write and an fdatasync of its own: a `flush: sync` write waits for the
    fdatasync of its bytes only. With the checkpoint's write held up, waiters are still released."""
    from tidelog.commitlog.checkpoint import CheckpointFile

    log = open_log(tmp_path, flush="sync")
    held, real_write = threading.Event(), CheckpointFile.write

    def slow_write(self, *args, **kwargs):
        held.wait(10)
        real_write(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointFile, "write", slow_write)

    async def one_write() -> float:
        placed = log.append([Message("t", 0, b"x" * 100)])
        started = time.monotonic()
        await log.flushed(placed[-1].phys_offset + placed[-1].size, timeout=5)
        return time.monotonic() - started

    try:
        waited = asyncio.run(one_write())
        assert not held.is_set() and waited < 5
    finally:
        held.set()
        log.close()


# --- truncation -----------------------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.integers(1, 80), st.integers(0, 79))
def test_truncate_at_a_record_then_append_more(tmp_path_factory, seed, n, cut_at):
    path = tmp_path_factory.mktemp("trunc")
    log = open_log(path)
    first = msgs(n, seed=seed)
    placed = log.append(first)
    log.epochs.append(1, 0)
    cut = min(cut_at, n - 1)
    log.epochs.append(2, placed[cut].phys_offset)
    log.truncate(placed[cut].phys_offset)
    assert log.max_offset == placed[cut].phys_offset
    # entries starting at or after the cut are gone (epoch 1 too when the cut is at 0)
    assert log.epochs.pairs() == ([(1, 0)] if placed[cut].phys_offset > 0 else [])
    more = msgs(10, seed=seed + 1)
    log.append(more)
    confirm_all(log)
    assert_same(read_all(log), first[:cut] + more)
    log.close()
    log = open_log(path)
    assert_same(read_all(log), first[:cut] + more)
    log.close()


def test_truncate_lowers_confirm_and_refuses_a_non_boundary(tmp_path):
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"x" * 100) for _ in range(5)])
    confirm_all(log)
    with pytest.raises(OffsetMismatchError):
        log.truncate(placed[2].phys_offset + 3)
    log.truncate(placed[2].phys_offset)
    assert log.confirm_offset == placed[2].phys_offset
    assert log.flushed_offset <= placed[2].phys_offset
    assert [m.queue_offset for m in log.read("t", 0, 0, 10)] == [0, 1]
    log.close()


# --- recovery: torn tails and corruption ----------------------------------------------------


def crash_image(src: Path, dst: Path) -> Path:
    """What the disk would hold if the process died now (page cache included)."""
    shutil.copytree(src, dst)
    return dst


def segment_files(path: Path) -> list[Path]:
    return sorted((path / "commitlog").iterdir())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.sampled_from(["truncate", "scribble"]), st.data())
def test_torn_tail_recovers_a_prefix_holding_every_flushed_record(tmp_path_factory, seed, how, data):
    base = tmp_path_factory.mktemp("torn")
    log = open_log(base / "live")
    flushed = msgs(30, seed=seed)
    log.append(flushed)
    log.flush()
    mark = log.flushed_offset
    unflushed = msgs(30, seed=seed + 1)
    log.append(unflushed)
    img = crash_image(base / "live", base / "img")
    log.close()
    # damage somewhere at or after the flushed offset
    at = data.draw(st.integers(mark, log.max_offset - 1))
    seg = img / "commitlog" / f"{at - at % SEG:020d}"
    size = seg.stat().st_size
    in_seg = min(at % SEG, size)
    with open(seg, "r+b") as f:
        if how == "truncate":
            f.truncate(in_seg)
        else:
            f.seek(in_seg)
            f.write(random.Random(seed).randbytes(data.draw(st.integers(1, 64))))
    for later in segment_files(img):
        if int(later.name) > at and how == "truncate":
            later.unlink()
    rec_log = open_log(img)
    confirm_all(rec_log)
    got = read_all(rec_log)
    everything = flushed + unflushed
    n_got = sum(len(v) for v in got.values())
    assert n_got >= len(flushed)
    assert_same(got, everything[:n_got])  # a prefix, in every queue
    assert rec_log.max_offset >= mark
    end = rec_log.max_offset
    rec_log.close()
    again = open_log(img)
    assert again.max_offset == end  # recovery is idempotent
    again.close()


def test_corrupt_record_in_the_rescanned_range_stops_recovery_naming_file_and_offset(tmp_path):
    """Damage between the consume queues' durable offset and the flushed offset was acknowledged
    as durable: the open re-reads that range and stops there, naming the file and offset."""
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"payload-%d" % i + b"x" * 200) for i in range(60)])
    log.flush()
    flushed, confirm = log.flushed_offset, log.confirm_offset
    log.close()
    # as a crash leaves it when the consume queues were last made durable at placed[5]
    CheckpointFile(str(tmp_path)).write(flushed, confirm, placed[5].phys_offset, clean=False)
    victim = placed[40]
    seg = tmp_path / "commitlog" / f"{victim.phys_offset - victim.phys_offset % SEG:020d}"
    with open(seg, "r+b") as f:
        f.seek(victim.phys_offset % SEG + 100)
        f.write(b"\xff")
    with pytest.raises(CorruptRecordError) as err:
        open_log(tmp_path)
    assert err.value.path == str(seg)
    assert err.value.offset == victim.phys_offset
    assert str(seg) in str(err.value) and str(victim.phys_offset) in str(err.value)


def test_a_restart_reads_only_what_was_written_since_the_checkpoint(tmp_path, monkeypatch):
    """Recovery after a crash starts at the checkpoint, not at the start of its segment: damage
    below the checkpoint is left to reads and to a full scan (FORMAT.md, Recovery)."""
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"payload-%d" % i + b"x" * 200) for i in range(60)])
    log.flush()
    log.close()
    last_base = placed[-1].phys_offset - placed[-1].phys_offset % SEG
    victim = next(
        p for p in placed if p.phys_offset >= last_base
    )  # in the last segment, below the checkpoint
    seg = tmp_path / "commitlog" / f"{last_base:020d}"
    with open(seg, "r+b") as f:
        f.seek(victim.phys_offset % SEG + 100)
        f.write(b"\xff")
    checked: list[int] = []
    real = rec.check_at
    monkeypatch.setattr(rec, "check_at", lambda mm, pos: checked.append(pos) or real(mm, pos))
    log = open_log(tmp_path)  # the open reads nothing below the checkpoint
    monkeypatch.undo()
    assert not [p for p in checked if p < (placed[-1].phys_offset + placed[-1].size) % SEG]
    confirm_all(log)
    with pytest.raises(CorruptRecordError) as err:
        log.read("t", 0, victim.queue_offset, 1)
    assert err.value.offset == victim.phys_offset and err.value.path == str(seg)
    log.close()
    with pytest.raises(CorruptRecordError):
        open_log(tmp_path, full_scan=True)


def test_an_emptied_segment_below_the_flushed_offset_stops_recovery(tmp_path):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 900) for _ in range(30)])
    log.flush()
    log.close()
    last = segment_files(tmp_path)[-1]
    last.write_bytes(b"")  # the file survived, its flushed bytes did not
    with pytest.raises(CorruptRecordError) as err:
        open_log(tmp_path)
    assert err.value.path == str(last) and err.value.offset == int(last.name)


def test_corruption_in_an_old_segment_fails_the_read_and_a_full_scan(tmp_path):
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"x" * 500) for _ in range(80)])
    log.close()
    victim = placed[1]  # first segment: not rescanned on a normal open
    with open(tmp_path / "commitlog" / f"{0:020d}", "r+b") as f:
        f.seek(victim.phys_offset + 200)
        f.write(b"\x00\x01")
    log = open_log(tmp_path)
    confirm_all(log)
    with pytest.raises(CorruptRecordError) as err:
        log.read("t", 0, 0, 10)
    assert err.value.offset == victim.phys_offset
    log.close()
    with pytest.raises(CorruptRecordError):
        open_log(tmp_path, full_scan=True)


def test_confirm_offset_is_persisted_and_clamped(tmp_path):
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"x" * 100) for _ in range(10)])
    log.confirm_offset = placed[4].phys_offset
    log.close()
    log = open_log(tmp_path)
    assert log.confirm_offset == placed[4].phys_offset
    log.close()


def test_consume_queues_are_rebuilt_when_missing(tmp_path):
    log = open_log(tmp_path)
    written = msgs(100, seed=9)
    log.append(written)
    confirm_all(log)
    log.close()
    shutil.rmtree(tmp_path / "consumequeue")
    log = open_log(tmp_path)
    assert_same(read_all(log), written)
    log.close()


def test_consume_queues_behind_the_log_are_caught_up(tmp_path):
    log = open_log(tmp_path)
    written = msgs(100, seed=11)
    log.append(written)
    confirm_all(log)
    img = crash_image(tmp_path, tmp_path.parent / (tmp_path.name + "-img"))
    log.close()
    # chop every consume-queue file of the crash image: units written but not synced are lost
    for f in (img / "consumequeue").rglob("0*"):
        if not f.is_file():
            continue
        with open(f, "r+b") as fh:
            fh.truncate(max(0, f.stat().st_size // 2 - 3))
    log = open_log(img)
    confirm_all(log)
    assert_same(read_all(log), written)
    log.close()


# --- raw replication ------------------------------------------------------------------------


def copy_raw(src: CommitLog, dst: CommitLog, chunk: int) -> None:
    off = dst.max_offset
    while off < src.max_offset:
        data = src.read_raw(off, chunk)
        assert data
        off = dst.append_raw(off, data)


@pytest.mark.parametrize("chunk", [1, 700, 5000, 1 << 20])
def test_raw_copy_is_byte_identical(tmp_path, chunk):
    master = open_log(tmp_path / "m")
    written = msgs(150, seed=5)
    master.append(written)
    slave = open_log(tmp_path / "s")
    copy_raw(master, slave, chunk)
    assert slave.max_offset == master.max_offset
    master.flush()
    slave.flush()
    for a, b in zip(segment_files(tmp_path / "m"), segment_files(tmp_path / "s"), strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()
    confirm_all(slave)
    assert_same(read_all(slave), written)
    master.close()
    slave.close()


def test_raw_append_checks_offset_and_content_before_writing(tmp_path):
    master = open_log(tmp_path / "m")
    master.append(msgs(10, seed=1))
    slave = open_log(tmp_path / "s")
    data = master.read_raw(0, 1 << 20)
    with pytest.raises(OffsetMismatchError):
        slave.append_raw(5, data)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(CorruptRecordError):
        slave.append_raw(0, bytes(bad))
    assert slave.max_offset == 0 and slave.queues() == []
    # a record claiming another position is refused too
    first = master.read_raw(0, 1)
    with pytest.raises(OffsetMismatchError):
        slave.append_raw(0, first + first)
    assert slave.max_offset == 0
    master.close()
    slave.close()


def test_read_raw_at_or_past_the_end_is_empty_and_below_retention_is_an_error(tmp_path):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 1000) for _ in range(40)])
    assert log.read_raw(log.max_offset, 100) == b""
    log.delete_expired(max_total_bytes=SEG * 2)
    assert log.min_offset > 0
    with pytest.raises(OffsetBelowRetentionError):
        log.read_raw(0, 100)
    log.close()


# --- retention ------------------------------------------------------------------------------


def test_retention_deletes_whole_old_segments_and_reads_below_fail_clearly(tmp_path):
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"%d" % i + b"x" * 900) for i in range(60)])
    confirm_all(log)
    n_before = len(segment_files(tmp_path))
    new_min = log.delete_expired(max_total_bytes=3 * SEG)
    assert new_min > 0 and new_min % SEG == 0
    assert len(segment_files(tmp_path)) == 3 < n_before
    qmin = log.queue_offsets("t", 0).min
    assert qmin == next(i for i, p in enumerate(placed) if p.phys_offset >= new_min)
    with pytest.raises(OffsetBelowRetentionError):
        log.read("t", 0, 0, 1)
    got = log.read("t", 0, qmin, 100)
    assert got[0].body.startswith(b"%d" % qmin) and got[-1].queue_offset == 59
    log.close()
    log = open_log(tmp_path)
    assert log.min_offset == new_min and log.queue_offsets("t", 0).min == qmin
    log.close()


def test_retention_by_age_and_keep_from(tmp_path):
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 900) for _ in range(60)])
    now = int(os.path.getmtime(segment_files(tmp_path)[0]) * 1000)
    assert log.delete_expired(now_ms=now, max_age_ms=60_000) == 0  # nothing old yet
    assert log.delete_expired(now_ms=now + 120_000, max_age_ms=60_000, keep_from=SEG + 1) == SEG
    new_min = log.delete_expired(now_ms=now + 120_000, max_age_ms=60_000)
    assert [f.name for f in segment_files(tmp_path)] == [f"{new_min:020d}"]  # the active segment stays
    assert new_min == log.max_offset - log.max_offset % SEG
    log.close()


def test_an_empty_log_starts_at_a_masters_min_offset_and_takes_its_bytes_from_there(tmp_path):
    """A replica joining a master whose retention deleted its start (ha/slavecore.py StartAt)."""
    master = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    while master.max_offset < 3 * SEG:
        master.append([Message("t", 0, b"x" * 300)])
    master.confirm_offset = master.max_offset
    start = master.delete_before(2 * SEG)
    assert start == 2 * SEG
    replica = CommitLog.open(tmp_path / "r", segment_bytes=SEG)
    with pytest.raises(OffsetMismatchError):
        replica.start_at(start + 1)  # not a segment boundary
    replica.start_at(start)
    assert (replica.min_offset, replica.max_offset) == (start, start)
    offset = start
    while offset < master.max_offset:
        data, offset_next = master.read_raw_chunk(offset, 1 << 20)
        replica.append_raw(offset, data)
        offset = offset_next if offset_next > offset else offset + len(data)
    assert replica.max_offset == master.max_offset
    replica.confirm_offset = replica.max_offset
    first = master.queue_offsets("t", 0).min
    assert [m.body for m in replica.read("t", 0, first, 5)] == [m.body for m in master.read("t", 0, first, 5)]
    with pytest.raises(OffsetMismatchError):
        replica.start_at(5 * SEG)  # it holds data now
    replica.close()
    replica = CommitLog.open(tmp_path / "r", segment_bytes=SEG)  # and it reopens as it was
    assert (replica.min_offset, replica.max_offset) == (start, master.max_offset)
    assert replica.queue_offsets("t", 0).min == first
    replica.close()
    master.close()
