"""The decisions of `tide group reset-offsets` and the per-member lag of `tide group describe`
(client/resetplan.py, pure), and who counts as a live member (client/assign.py::active_members).

A reset is checked whole: any queue that would land outside its min..confirmed range refuses
the whole plan; properties over random queues check that a plan that is returned is inside
every range and keeps each queue's commit as `before`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client import assign as asg
from tidelog.client import resetplan as rp
from tidelog.errors import InvalidArgumentError, ResetOffsetOutOfRangeError

Q = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1717171717000", 1717171717000),
        ("2024-05-31T16:08:37Z", 1717171717000),
        ("2024-05-31T18:08:37+02:00", 1717171717000),
        ("2024-05-31T16:08:37", 1717171717000),  # no offset: UTC
        ("2024-05-31T16:08:37.250Z", 1717171717250),
        ("2024-05-31", 1717113600000),
    ],
)
def test_timestamps_are_epoch_ms_or_iso_8601(text: str, ms: int) -> None:
    assert rp.parse_timestamp(text) == ms


@pytest.mark.parametrize("text", ["yesterday", "", "2024-13-01T00:00:00", "12:00", "-5", "1969-12-31T00:00Z"])
def test_unreadable_or_negative_timestamps_are_invalid(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        rp.parse_timestamp(text)
    assert err.value.hint  # says what to give instead


def test_targets_need_their_value_and_only_theirs() -> None:
    assert rp.target("earliest") == rp.Target("earliest")
    assert rp.target("offset", offset=7) == rp.Target("offset", offset=7)
    assert rp.target("timestamp", timestamp="5") == rp.Target("timestamp", timestamp_ms=5)
    for bad in (
        lambda: rp.target("offset"),
        lambda: rp.target("timestamp"),
        lambda: rp.target("latest", offset=3),
        lambda: rp.target("earliest", timestamp="5"),
        lambda: rp.target("offset", offset=1, timestamp="5"),
        lambda: rp.target("middle"),
        lambda: rp.target("timestamp", timestamp="soon"),
    ):
        with pytest.raises(InvalidArgumentError):
            bad()
    with pytest.raises(ResetOffsetOutOfRangeError, match="negative"):
        rp.target("offset", offset=-1)


def test_queue_selection() -> None:
    assert rp.select_queues(Q, None, []) == Q
    assert rp.select_queues(Q, 1, []) == [("a", 1), ("b", 1)]
    assert rp.select_queues(Q, None, ["b"]) == [("b", 0), ("b", 1)]
    assert rp.select_queues(Q, 0, ["a"]) == [("a", 0)]
    with pytest.raises(InvalidArgumentError, match="broker set"):
        rp.select_queues(Q, None, ["c"])
    with pytest.raises(InvalidArgumentError, match="no queue 9"):
        rp.select_queues(Q, 9, [])


def _states() -> list[rp.QueueState]:
    return [
        rp.QueueState(("a", 0), 0, 10, 4, at_time=3),
        rp.QueueState(("a", 1), 2, 20, None, at_time=20),
        rp.QueueState(("b", 0), 5, 5, 5, at_time=5),
    ]


def test_each_target_picks_its_offset() -> None:
    def after(t: rp.Target) -> list[int]:
        return [p.after for p in rp.plan_reset(t, _states())]

    assert after(rp.Target("earliest")) == [0, 2, 5]
    assert after(rp.Target("latest")) == [10, 20, 5]
    assert after(rp.Target("timestamp", timestamp_ms=1)) == [3, 20, 5]
    assert after(rp.Target("offset", offset=5)) == [5, 5, 5]
    assert [p.before for p in rp.plan_reset(rp.Target("earliest"), _states())] == [4, None, 5]


def test_an_offset_outside_any_queue_refuses_the_whole_reset() -> None:
    with pytest.raises(ResetOffsetOutOfRangeError) as err:
        rp.plan_reset(rp.Target("offset", offset=11), _states())
    assert "a/0 holds 0..10" in err.value.message and "b/0 holds 5..5" in err.value.message
    assert "a/1" not in err.value.message  # 11 is inside a/1's 2..20
    with pytest.raises(ResetOffsetOutOfRangeError, match="a/1 holds 2..20"):
        rp.plan_reset(rp.Target("offset", offset=1), _states())


_STATE = st.tuples(st.integers(0, 50), st.integers(0, 50), st.one_of(st.none(), st.integers(0, 100))).map(
    lambda t: (min(t[0], t[1]), max(t[0], t[1]), t[2])
)


@given(st.lists(_STATE, min_size=1, max_size=6), st.integers(0, 60))
def test_a_plan_is_inside_every_range_or_refused(states: list[tuple[int, int, int | None]], n: int) -> None:
    qs = [rp.QueueState(("s", i), lo, hi, c, at_time=lo) for i, (lo, hi, c) in enumerate(states)]
    inside = all(lo <= n <= hi for lo, hi, _ in states)
    try:
        plan = rp.plan_reset(rp.Target("offset", offset=n), qs)
    except ResetOffsetOutOfRangeError:
        assert not inside
        return
    assert inside
    assert [(p.queue, p.before, p.after) for p in plan] == [(s.queue, s.committed, n) for s in qs]
    for t in ("earliest", "latest", "timestamp"):  # always inside
        got = rp.plan_reset(rp.Target(t, timestamp_ms=0 if t == "timestamp" else None), qs)
        assert all(s.min <= p.after <= s.confirmed for p, s in zip(got, qs, strict=True))


def test_member_lag_sums_each_owners_queues_and_lists_idle_live_members() -> None:
    rows = [
        {"broker_set": "b", "queue": 0, "lag": 3, "owner": "m1"},
        {"broker_set": "a", "queue": 1, "lag": 4, "owner": "m1"},
        {"broker_set": "a", "queue": 0, "lag": 5, "owner": "gone"},
        {"broker_set": "b", "queue": 1, "lag": 7, "owner": None},
    ]
    assert rp.member_lag(rows, ["m1", "idle"]) == [
        {"member": "gone", "queues": ["a/0"], "lag": 5, "live": False},
        {"member": "idle", "queues": [], "lag": 0, "live": True},
        {"member": "m1", "queues": ["a/1", "b/0"], "lag": 7, "live": True},
    ]


def test_active_members_are_judged_by_their_own_session_timeout() -> None:
    prefix = asg.members_prefix("g")
    entries = [
        (prefix + "short", asg.announcement(10_000, "t", 1_000)),  # 2 s ago, session 1 s: gone
        (prefix + "long", asg.announcement(10_000, "t", 30_000)),  # 2 s ago, session 30 s: live
        (prefix + "old", asg.announcement(5_000, "t")),  # 7 s ago, the default 6 s: gone
        (prefix + "other", asg.announcement(11_000, "u")),
        (prefix + "junk", b"{"),
    ]
    assert asg.active_members(entries, prefix, 12_000) == {"long": "t", "other": "u"}
    assert asg.active_members(entries, prefix, 12_000, ["t"]) == {"long": "t"}
    assert asg.active_members(entries, prefix, 12_000, []) == {}
