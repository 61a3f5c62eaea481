"""The scrub's check of a running log (`CommitLog.scrub`, commitlog/verify.py::scrub_chunk): a
pass over the log in chunks of any size finds a flipped byte anywhere below the stable end as
exactly the record it damaged (what a repair copies), and nothing in a whole log."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.verify import Damage

SEG = 1 << 16  # small segments: the pass crosses several, and their blank tails


def _log(path: Path) -> CommitLog:
    log = CommitLog.open(path, segment_bytes=SEG, flush="async")
    log.append([Message("t", 0, b"%04d" % i * 60) for i in range(300)])
    log.confirm_offset = log.max_offset
    log.flush()
    return log


def _pass(log: CommitLog, chunk: int) -> list[Damage]:
    """One whole pass from the log's start, as the scrub makes it."""
    found, at = [], log.min_offset
    while True:
        nxt, damage = log.scrub(at, chunk)
        if damage is not None:
            found.append(damage)
        if nxt == at:
            return found
        assert nxt > at
        at = nxt


def test_a_whole_log_scrubs_clean_and_the_pass_ends_at_the_stable_end(tmp_path: Path) -> None:
    log = _log(tmp_path / "l")
    try:
        assert _pass(log, 1000) == []
        log.append([Message("t", 0, b"not yet confirmed")])  # past the stable end: not read
        assert log.scrub(log.confirm_offset, 1 << 20) == (log.confirm_offset, None)
    finally:
        log.close()


@settings(max_examples=25, deadline=None)
@given(record=st.integers(0, 299), into=st.integers(0, 1 << 30), chunk=st.integers(1, 1 << 17))
def test_a_flipped_byte_is_found_as_the_record_it_damaged(
    tmp_path_factory: object, record: int, into: int, chunk: int
) -> None:
    path = tmp_path_factory.mktemp("scrub")  # type: ignore[attr-defined]
    log = _log(path)
    try:
        placed = log.read("t", 0, record, 1)[0]
        at = placed.phys_offset + 8 + into % (placed.size - 8)  # past its length and magic
        seg = f"{path}/commitlog/{placed.phys_offset // SEG * SEG:020d}"
        with open(seg, "r+b") as f:
            f.seek(at - placed.phys_offset // SEG * SEG)
            b = f.read(1)
            f.seek(at - placed.phys_offset // SEG * SEG)
            f.write(bytes([b[0] ^ 0xFF]))
        found = _pass(log, chunk)
        assert [(d.start, d.end) for d in found] == [(placed.phys_offset, placed.phys_offset + placed.size)]
    finally:
        log.close()


RECORD = 305  # the size of each record `_log` writes


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(1, 4096) | st.builds(lambda k, r: k * RECORD + r, st.integers(1, 12), st.integers(1, 7))
)
def test_a_whole_log_scrubs_clean_in_chunks_of_any_size(tmp_path_factory: object, chunk: int) -> None:
    """A chunk that ends a few bytes into the next record's header is not damage: the next chunk
    starts at that record (it was reported as 'no record below the flushed offset', and a sound
    replica then handed its mastership over to repair it, under load in the suite)."""
    log = _log(tmp_path_factory.mktemp("clean"))  # type: ignore[attr-defined]
    try:
        assert log.read("t", 0, 1, 1)[0].phys_offset == RECORD
        assert _pass(log, chunk) == []
    finally:
        log.close()
