"""The offset for a store time (`CommitLog.offset_for_time`, commitlog/reads.py::first_stored_at):
the first confirmed queue offset whose record was stored at or after a time.

The search is checked as a property over sorted lists of store times, then on a real log: only
confirmed records count, records below retention are skipped, and a time after every record
answers the queue's confirmed end."""

from __future__ import annotations

import bisect
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.reads import first_stored_at

T = "t"


@given(
    st.lists(st.integers(0, 40), max_size=60).map(sorted),
    st.integers(-5, 45),
    st.integers(0, 10),
)
def test_the_search_finds_the_first_store_time_at_or_after(times: list[int], wanted: int, lo: int) -> None:
    lo = min(lo, len(times))
    probed: list[int] = []

    def at(i: int) -> int:
        assert lo <= i < len(times), "probed outside [lo, hi)"
        probed.append(i)
        return times[i]

    got = first_stored_at(lo, len(times), wanted, at)
    expect = next((i for i in range(lo, len(times)) if times[i] >= wanted), len(times))
    assert got == expect
    assert len(probed) <= max(1, (len(times) - lo).bit_length() + 1)  # a binary search, not a scan
    assert got == bisect.bisect_left(times, wanted, lo=lo)


def _log(tmp_path: Path) -> CommitLog:
    return CommitLog.open(tmp_path, segment_bytes=4096)


def test_on_a_log_only_confirmed_records_count(tmp_path: Path) -> None:
    log = _log(tmp_path)
    try:
        for i in range(20):  # store times 1000, 1010, ..., two records per time from 10 on
            log.append([Message(T, 0, b"m%d" % i)], now_ms=1000 + 10 * min(i, 10 + (i - 10) // 2))
        log.append([Message(T, 1, b"other")], now_ms=1)  # another queue's times do not matter
        log.confirm_offset = log.max_offset
        assert log.offset_for_time(T, 0, 0) == 0
        assert log.offset_for_time(T, 0, 1000) == 0
        assert log.offset_for_time(T, 0, 1001) == 1
        assert log.offset_for_time(T, 0, 1100) == 10
        assert log.offset_for_time(T, 0, 1105) == 12
        assert log.offset_for_time(T, 0, 1140) == 18
        assert log.offset_for_time(T, 0, 1141) == 20  # after every record: the confirmed end
        log.append([Message(T, 0, b"late")], now_ms=5000)  # not confirmed: not found
        assert log.offset_for_time(T, 0, 4000) == 20
        log.confirm_offset = log.max_offset
        assert log.offset_for_time(T, 0, 4000) == 20 and log.offset_for_time(T, 0, 5001) == 21
        assert log.offset_for_time("nosuch", 0, 0) == 0  # a queue with nothing: its (empty) end
    finally:
        log.close()


def test_records_below_retention_are_not_found(tmp_path: Path) -> None:
    log = _log(tmp_path)
    try:
        for i in range(60):  # several segments of 4 KiB
            log.append([Message(T, 0, b"x" * 200)], now_ms=1000 + i)
        log.confirm_offset = log.max_offset
        log.delete_before(log.segment_infos()[-1].base)
        low = log.queue_offsets(T, 0).min
        assert low > 0
        assert log.offset_for_time(T, 0, 0) == low
        assert log.offset_for_time(T, 0, 1000 + low + 3) == low + 3
    finally:
        log.close()
