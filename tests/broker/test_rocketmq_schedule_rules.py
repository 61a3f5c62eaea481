"""The rules of delayed and transactional RocketMQ messages (broker/delayrules.py,
broker/txstate.py): table tests of the documented cases and Hypothesis over random sequences of
events, times and moves."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker import delayrules as dr
from tidelog.broker import txstate as tx

# --- delays ------------------------------------------------------------------------------------


def test_a_delivery_time_is_a_wait_from_now_bounded_by_the_maximum() -> None:
    assert dr.delay_ms(10_000, 7_000) == 3_000
    assert dr.delay_ms(5_000, 7_000) == 0, "a time already past is delivered at once"
    assert dr.delay_ms(1_000 + dr.MAX_DELAY_MS, 1_000) == dr.MAX_DELAY_MS
    with pytest.raises(dr.DeliveryTimeError, match="at most"):
        dr.delay_ms(1_001 + dr.MAX_DELAY_MS, 1_000)
    with pytest.raises(dr.DeliveryTimeError, match="needs"):
        dr.delay_ms(0, 1_000)
    with pytest.raises(dr.DeliveryTimeError):
        dr.delay_ms(60_000, 0, max_delay_ms=59_999)


@pytest.mark.parametrize(
    ("delay", "b"),
    [(0, 0), (1, 0), (1000, 0), (1001, 1), (2000, 1), (2001, 2), (4000, 2), (4001, 3), (60_000, 6)],
)
def test_a_bucket_holds_delays_within_a_factor_of_two(delay: int, b: int) -> None:
    assert dr.bucket(delay) == b


def test_the_longest_delay_has_a_bucket() -> None:
    assert dr.bucket(dr.MAX_DELAY_MS) == dr.BUCKETS - 1
    assert 2 ** (dr.BUCKETS - 1) * 1000 >= dr.MAX_DELAY_MS


def test_a_message_not_due_does_not_hold_back_a_due_one_behind_it() -> None:
    p = dr.Progress()
    kept = [(0, 5_000), (1, 1_000), (2, 2_000)]
    assert dr.due(p, kept, 2_000) == [1, 2]
    dr.mark(p, [1, 2])
    assert (p.floor, p.done) == (0, {1, 2})
    assert dr.due(p, kept, 4_999) == []
    assert dr.next_due(p, kept) == 5_000
    dr.mark(p, [0])
    assert (p.floor, p.done) == (3, set())
    assert dr.next_due(p, kept) is None


def test_the_scan_starts_at_the_floor_or_retention_and_is_bounded() -> None:
    p = dr.Progress(10)
    assert dr.scan_range(p, 0, 20) == (10, 20)
    assert dr.scan_range(p, 15, 20) == (15, 20)
    assert dr.scan_range(p, 0, 10**6) == (10, 10 + dr.WINDOW)


def test_retention_trims_the_progress() -> None:
    p = dr.Progress(0, {2, 5})
    dr.trim(p, 2)
    assert (p.floor, p.done) == (3, {5})


def test_progress_round_trips_and_bad_records_are_refused() -> None:
    p = dr.Progress(7, {9, 12})
    assert dr.decode(json.loads(json.dumps(dr.encode(p)))) == p
    for bad in ({}, {"f": -1, "d": []}, {"f": 3, "d": [0]}, {"f": 3, "d": ["x"]}, None):
        with pytest.raises(ValueError):
            dr.decode(bad)


@settings(max_examples=300, deadline=None)
@given(
    delays=st.lists(st.integers(0, 20_000), min_size=1, max_size=40),
    ticks=st.lists(st.integers(0, 3_000), min_size=1, max_size=30),
    lost=st.lists(st.booleans(), max_size=30),
)
def test_a_delayed_message_moves_once_and_never_before_its_time(
    delays: list[int], ticks: list[int], lost: list[bool]
) -> None:
    """Whatever the tick times, and when a master loses its last move (the progress is then the
    one stored before it, as after a failover), no message moves before its time, and each moves
    once in the end: the shell's look-back finds the copies a lost move made."""
    kept = [(off, d) for off, d in enumerate(delays)]
    stored = dr.Progress()
    copies: dict[int, int] = {}  # offset -> when copied
    now = 0
    for i, t in enumerate([*ticks, 10**6]):
        now += t
        p = stored.copy()
        got = dr.due(p, kept, now)
        fresh = [off for off in got if off not in copies]  # the look-back: copied already
        for off in fresh:
            copies[off] = now
        dr.mark(p, got)
        if not (i < len(lost) and lost[i]):
            stored = p
    assert sorted(copies) == [off for off, _ in kept]
    assert all(copies[off] >= at for off, at in kept)


# --- transactions ------------------------------------------------------------------------------

POLICY = tx.Policy(check_interval_ms=1_000, max_checks=3)


def opened(*stored_ms: int) -> tx.TxState:
    s = tx.TxState()
    for off, at in enumerate(stored_ms):
        assert tx.step(s, tx.Added(off, at), at, POLICY) == []
    return s


def test_commit_delivers_once_and_rollback_never() -> None:
    s = opened(0, 0)
    assert tx.step(s, tx.End(0, commit=True), 10, POLICY) == [tx.Deliver(0)]
    assert tx.step(s, tx.End(1, commit=False), 10, POLICY) == [tx.Drop(1, checked_out=False)]
    assert (s.floor, s.next, s.open) == (2, 2, {})


def test_an_unknown_or_ended_transaction_is_refused_and_changes_nothing() -> None:
    s = opened(0, 0)
    tx.step(s, tx.End(0, commit=True), 10, POLICY)
    before = s.copy()
    assert tx.step(s, tx.End(0, commit=True), 20, POLICY) == [tx.Refuse(0, "ended")]
    assert tx.step(s, tx.End(0, commit=False), 20, POLICY) == [tx.Refuse(0, "ended")]
    assert tx.step(s, tx.End(2, commit=True), 20, POLICY) == [tx.Refuse(2, "unknown")]
    assert tx.step(s, tx.End(-1, commit=True), 20, POLICY) == [tx.Refuse(-1, "unknown")]
    assert s == before


def test_an_added_half_message_is_seen_once_in_order() -> None:
    s = opened(0)
    assert tx.step(s, tx.Added(0, 5), 5, POLICY) == []
    assert tx.step(s, tx.Added(3, 5), 5, POLICY) == []
    assert (s.next, sorted(s.open)) == (1, [0])


def test_an_orphan_is_checked_every_interval_then_rolled_back() -> None:
    s = opened(0)
    assert tx.step(s, tx.Tick(), 999, POLICY) == []
    assert tx.next_check(s) == 1_000
    assert tx.step(s, tx.Tick(), 1_000, POLICY) == [tx.Check(0, 1)]
    assert tx.step(s, tx.Tick(), 1_500, POLICY) == []
    assert tx.step(s, tx.Tick(), 2_000, POLICY) == [tx.Check(0, 2)]
    assert tx.step(s, tx.Tick(), 3_000, POLICY) == [tx.Check(0, 3)]
    assert tx.step(s, tx.Tick(), 4_000, POLICY) == [tx.Drop(0, checked_out=True)]
    assert tx.step(s, tx.End(0, commit=True), 4_001, POLICY) == [tx.Refuse(0, "ended")]


def test_a_checked_transaction_is_settled_by_the_checkers_answer() -> None:
    s = opened(0)
    assert tx.step(s, tx.Tick(), 1_000, POLICY) == [tx.Check(0, 1)]
    assert tx.step(s, tx.End(0, commit=True), 1_100, POLICY) == [tx.Deliver(0)]
    assert tx.step(s, tx.Tick(), 10_000, POLICY) == []


def test_retention_trims_the_transaction_state() -> None:
    s = opened(0, 0, 0)
    tx.step(s, tx.End(0, commit=True), 10, POLICY)
    tx.trim(s, 2)
    assert (s.floor, s.next, sorted(s.open)) == (2, 3, [2])
    tx.trim(s, 5)
    assert (s.floor, s.next, s.open) == (5, 5, {})
    assert tx.step(s, tx.End(2, commit=True), 20, POLICY) == [tx.Refuse(2, "ended")]


def test_the_state_round_trips_and_bad_records_are_refused() -> None:
    s = opened(0, 5, 9)
    tx.step(s, tx.End(0, commit=True), 10, POLICY)
    tx.step(s, tx.Tick(), 1_005, POLICY)
    assert tx.decode(json.loads(json.dumps(tx.encode(s)))) == s
    for bad in (
        {},
        {"f": 2, "n": 1, "o": []},
        {"f": 0, "n": 3, "o": [[5, 0, 0]]},
        {"f": 0, "n": 3, "o": [[1, 0, 0]]},
        {"f": 0, "n": 3, "o": [[0, 0]]},
    ):
        with pytest.raises(ValueError):
            tx.decode(bad)


_events = st.lists(
    st.one_of(
        st.builds(tx.Added, st.integers(0, 6), st.integers(0, 5_000)),
        st.builds(tx.End, st.integers(-1, 7), st.booleans()),
        st.just(tx.Tick()),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(events=_events, steps=st.lists(st.integers(0, 1_500), max_size=60))
def test_a_rolled_back_message_is_never_delivered_and_a_committed_one_once(
    events: list[tx.Event], steps: list[int]
) -> None:
    s = tx.TxState()
    now = 0
    delivered: list[int] = []
    dropped: set[int] = set()
    commits: set[int] = set()
    for i, event in enumerate(events):
        now += steps[i] if i < len(steps) else 0
        before = s.copy()
        actions = tx.step(s, event, now, POLICY)
        for a in actions:
            if isinstance(a, tx.Deliver):
                assert isinstance(event, tx.End) and event.commit and a.offset == event.offset
                assert a.offset not in dropped
                delivered.append(a.offset)
                commits.add(a.offset)
            elif isinstance(a, tx.Drop):
                assert a.offset not in commits
                dropped.add(a.offset)
            elif isinstance(a, tx.Refuse):
                assert s == before
            else:
                assert a.attempt <= POLICY.max_checks
        assert s.floor == min(s.open, default=s.next)
        assert tx.decode(tx.encode(s)) == s
    assert len(delivered) == len(set(delivered))
    assert not commits & dropped
