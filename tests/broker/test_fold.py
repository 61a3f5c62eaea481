"""The one rebuild of state from an internal topic (broker/fold.py), over a real commit log: each
record is folded in once and in order, `confirmed_only` stops at the confirm offset, and a
truncation below what was folded (fork repair) folds again from the first record."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.fold import TopicFold
from tidelog.commitlog import CommitLog, Message, StoredMessage

TOPIC = "%STATE%"


def _append(log: CommitLog, *bodies: bytes, confirm: bool = True) -> None:
    log.append([Message(TOPIC, 0, body) for body in bodies])
    if confirm:
        log.confirm_offset = log.max_offset


def _fold(log: CommitLog, *, confirmed_only: bool = False) -> tuple[TopicFold, list[bytes], list[str]]:
    state: list[bytes] = []
    events: list[str] = []

    def apply(m: StoredMessage) -> None:
        state.append(m.body)

    def clear() -> None:
        state.clear()
        events.append("cleared")

    return TopicFold(log, TOPIC, apply, clear, confirmed_only=confirmed_only), state, events


def test_each_record_is_folded_once_in_order(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path / "log", segment_bytes=1 << 20)
    fold, state, _ = _fold(log)
    assert fold.refresh() == 0
    _append(log, b"a", b"b")
    assert fold.refresh() == 2
    _append(log, b"c")
    assert fold.refresh() == 1
    assert fold.refresh() == 0
    assert state == [b"a", b"b", b"c"] and fold.applied == 3
    log.close()


def test_confirmed_only_stops_at_the_confirm_offset(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path / "log", segment_bytes=1 << 20)
    confirmed, seen, _ = _fold(log, confirmed_only=True)
    whole, everything, _ = _fold(log)
    _append(log, b"a")
    _append(log, b"b", confirm=False)
    confirmed.refresh()
    whole.refresh()
    assert seen == [b"a"] and everything == [b"a", b"b"]
    log.confirm_offset = log.max_offset
    confirmed.refresh()
    assert seen == [b"a", b"b"]
    log.close()


def test_a_truncation_below_what_was_folded_folds_again(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path / "log", segment_bytes=1 << 20)
    fold, state, events = _fold(log)
    _append(log, b"a")
    fork = log.max_offset
    _append(log, b"b", b"c")
    fold.refresh()
    assert state == [b"a", b"b", b"c"]
    log.truncate(fork)  # fork repair: b and c were never the set's history
    _append(log, b"d")
    fold.refresh()
    assert events == ["cleared"] and state == [b"a", b"d"] and fold.applied == 2
    log.close()
