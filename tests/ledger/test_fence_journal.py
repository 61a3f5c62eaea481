"""A replica's fences (ledger/store.py): a fence is one line appended to the journal, not a
rewrite of every fence; reopening applies the journal over the file; a torn last append is cut
off, other damage refuses the open; the journal is folded into the file once it has as many
lines as the file has fences."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import CorruptRecordError
from tidelog.ledger import store
from tidelog.ledger.store import FENCES_FILE, FENCES_JOURNAL, LedgerIndex


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def log(data: Path) -> Iterator[CommitLog]:
    opened = CommitLog.open(data, flush="async")
    yield opened
    opened.close()


def _grow(log: CommitLog) -> None:
    log.append([Message("t", 0, b"x" * 10)])


def _reopened(log: CommitLog) -> dict[int, bool]:
    index = LedgerIndex(log)
    return {lid: index.is_fenced(lid) for lid in index.fenced_ledgers()}


def test_a_fence_is_one_journal_line_and_survives_a_reopen(log: CommitLog, data: Path) -> None:
    index = LedgerIndex(log)
    for lid in range(5):
        _grow(log)
        assert index.fence(lid)
    assert not index.fence(3)  # already fenced: nothing written
    journal = data / FENCES_JOURNAL
    assert len(journal.read_bytes().splitlines()) == 5
    assert not (data / FENCES_FILE).exists()  # nothing rewrote a file of every fence
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    again = LedgerIndex(log)
    assert again.fenced_ledgers() == [0, 1, 2, 3, 4]
    assert again._fences == index._fences  # the same fence offsets


def test_a_torn_last_append_is_cut_off_and_later_fences_still_count(log: CommitLog, data: Path) -> None:
    index = LedgerIndex(log)
    _grow(log)
    index.fence(1)
    journal = data / FENCES_JOURNAL
    with open(journal, "ab") as f:
        f.write(b"2 12")  # a crash in the middle of the next append: never answered
    again = LedgerIndex(log)
    assert again.fenced_ledgers() == [1]
    _grow(log)
    again.fence(3)
    assert LedgerIndex(log).fenced_ledgers() == [1, 3]


def test_a_damaged_whole_line_refuses_the_open(log: CommitLog, data: Path) -> None:
    index = LedgerIndex(log)
    for lid in (1, 2):
        _grow(log)
        index.fence(lid)
    journal = data / FENCES_JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0].replace(b"1 ", b"7 ", 1) + lines[1])
    with pytest.raises(CorruptRecordError, match="fences journal"):
        LedgerIndex(log)


def test_the_journal_is_folded_into_the_file_once_as_long_as_the_fences(
    log: CommitLog, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "MIN_JOURNAL_LINES", 3)
    index = LedgerIndex(log)
    for lid in range(4):
        _grow(log)
        index.fence(lid)
    # the fourth fence found 3 lines, as many as the minimum (the file held none): it rewrote
    # the file with all four and emptied the journal
    assert (data / FENCES_JOURNAL).read_bytes() == b""
    assert (data / FENCES_FILE).exists()
    _grow(log)
    index.fence(9)
    assert len((data / FENCES_JOURNAL).read_bytes().splitlines()) == 1
    assert LedgerIndex(log)._fences == index._fences


def test_lines_a_rewrite_already_covered_change_nothing(log: CommitLog, data: Path) -> None:
    """A crash after a rewrite that lowered a fence (a truncation) and before the journal was
    emptied: the journal's older, higher offset must not win."""
    index = LedgerIndex(log)
    for _ in range(3):
        _grow(log)
    index.fence(5)
    stale = (data / FENCES_JOURNAL).read_bytes()
    high = index._fences[5]
    index._on_truncate(high - 10)  # lowers the fence and rewrites the file
    assert index._fences[5] == high - 10
    (data / FENCES_JOURNAL).write_bytes(stale)
    assert LedgerIndex(log)._fences[5] == high - 10
