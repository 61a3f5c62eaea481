"""The subscription modes' rules (client/modes.py): who gives way, who holds the active key, who
shares the queues; table tests from the documented cases and Hypothesis for the agreement rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client import assign as asg
from tidelog.client import handover as ho
from tidelog.client import modes as md

Q = [("bs", i) for i in range(4)]


@pytest.mark.parametrize(
    ("me", "mine", "live", "expected"),
    [
        # the same mode never conflicts
        ("m", md.Announced("failover", 5), {"b": md.Announced("failover", 1)}, None),
        # another mode announced earlier wins
        ("m", md.Announced("clustering", 5), {"b": md.Announced("failover", 1)}, "b"),
        # another mode announced later gives way to this member
        ("m", md.Announced("clustering", 1), {"b": md.Announced("failover", 5)}, None),
        # the same first announcement: the lower member id wins
        ("m", md.Announced("clustering", 3), {"a": md.Announced("broadcast", 3)}, "a"),
        ("a", md.Announced("clustering", 3), {"m": md.Announced("broadcast", 3)}, None),
        # this member's own announcement is not a conflict
        ("m", md.Announced("clustering", 3), {"m": md.Announced("failover", 1)}, None),
    ],
)
def test_conflict_table(
    me: str, mine: md.Announced, live: dict[str, md.Announced], expected: str | None
) -> None:
    assert md.conflict(me, mine, live) == expected


@given(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3),
        st.tuples(st.sampled_from(md.MODES), st.integers(0, 5)),
        min_size=1,
        max_size=6,
    )
)
def test_members_that_see_the_same_announcements_settle_on_one_mode(
    seen: dict[str, tuple[str, int]],
) -> None:
    live = {m: md.Announced(mode, since) for m, (mode, since) in seen.items()}
    staying = [m for m, a in live.items() if md.conflict(m, a, live) is None]
    assert staying, "somebody always stays"
    assert len({live[m].mode for m in staying}) == 1, "the members that stay read in one mode"
    first = min(live, key=lambda m: (live[m].since_ms, m))
    assert first in staying, "the earliest member never gives way"


@pytest.mark.parametrize(
    ("mode", "holder", "live", "expected"),
    [
        ("failover", None, {"me"}, md.Decision("create")),
        ("exclusive", None, {"me"}, md.Decision("create")),
        ("failover", ("me", 3), {"me"}, md.Decision("hold", "me", 3)),
        ("failover", ("a", 3), {"me", "a"}, md.Decision("wait", "a", 3)),
        ("exclusive", ("a", 3), {"me", "a"}, md.Decision("refuse", "a", 3)),
        # the holder's session expired: take the key over at its version, in either mode
        ("failover", ("a", 3), {"me"}, md.Decision("replace", "a", 3)),
        ("exclusive", ("a", 3), {"me"}, md.Decision("replace", "a", 3)),
    ],
)
def test_decide_active_table(
    mode: str, holder: tuple[str, int] | None, live: set[str], expected: md.Decision
) -> None:
    assert md.decide_active("me", mode, holder, live) == expected


def test_sharing_per_mode() -> None:
    live = {"b", "a", "me"}
    assert md.sharing("clustering", "me", live, None) == ["a", "b", "me"]
    assert md.sharing("broadcast", "me", live, None) == ["me"]
    assert md.sharing("failover", "me", live, "a") == ["a"]
    assert md.sharing("exclusive", "me", live, None) == []


def test_broadcast_members_keep_their_state_under_their_own_name() -> None:
    assert md.state_group("g", "broadcast", "m1") == "g@m1"
    assert md.state_group("g", "clustering", "m1") == "g"
    assert md.state_group("g", "failover", "m1") == "g"


def test_the_active_member_reads_every_queue_and_a_standby_none() -> None:
    owners: dict[ho.Queue, ho.Owner] = {}
    active = ho.plan("a", md.sharing("failover", "a", {"a", "b"}, "a"), Q, owners, ())
    assert active.take == tuple(Q)
    standby = ho.plan("b", md.sharing("failover", "b", {"a", "b"}, "a"), Q, owners, ())
    assert standby == ho.Plan()


def test_a_standby_that_took_the_active_key_takes_the_dead_members_queues_over() -> None:
    owners = {q: ho.Owner("a", 7) for q in Q}
    step = ho.plan("b", md.sharing("failover", "b", {"b"}, "b"), Q, owners, ())
    assert step.take_over == tuple((q, 7) for q in Q)


def test_a_displaced_active_member_releases_what_it_holds() -> None:
    owners = {q: ho.Owner("a", 7) for q in Q}
    step = ho.plan("a", md.sharing("failover", "a", {"a", "b"}, "b"), Q, owners, Q)
    assert step.release == tuple(Q)


def test_announcements_carry_the_mode_and_older_ones_are_clustering() -> None:
    prefix = asg.members_prefix("g")
    entries = [
        (prefix + "a", asg.announcement(10_000, "t", mode="failover", since_ms=4_000)),
        (prefix + "b", b'{"ts": 10000, "topic": "t"}'),  # written before modes existed
        (prefix + "c", asg.announcement(10_000, "t", mode="no-such-mode")),
        (prefix + "d", b"[1, 2]"),
    ]
    assert asg.live_announced(entries, prefix, 10_000, 5_000, "t") == {
        "a": md.Announced("failover", 4_000),
        "b": md.Announced("clustering", 10_000),
    }


def test_the_modes_members_announced_live_or_not() -> None:
    prefix = asg.members_prefix("g")
    entries = [
        (prefix + "a", asg.announcement(1, "t", mode="shared")),
        (prefix + "b", b'{"ts": 1, "topic": "t"}'),
        (prefix + "c", b"not json"),
        ("group/other/members/d", asg.announcement(1, "t", mode="failover")),
    ]
    assert asg.modes(entries, prefix) == {"a": "shared", "b": "clustering"}
