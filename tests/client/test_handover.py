"""The consumer group's ownership rules (client/handover.py): sticky assignment and the hand-over
plan of one member, as tables and a Hypothesis property (no processes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client import handover as ho

Q = [("a", i) for i in range(6)]


def owners_of(assignment: dict[ho.Queue, str], version: int = 1) -> dict[ho.Queue, ho.Owner]:
    return {q: ho.Owner(m, version) for q, m in assignment.items()}


def counts(target: dict[ho.Queue, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in target.values():
        out[m] = out.get(m, 0) + 1
    return out


@pytest.mark.parametrize(
    ("members", "owners", "expected"),
    [
        # nobody owns anything: queues go out in order, member by member
        (["m1", "m2", "m3"], {}, {"m1": Q[0:2], "m2": Q[2:4], "m3": Q[4:6]}),
        # one member owned everything: it keeps its first two, the others get the rest
        (["m1", "m2", "m3"], {q: "m3" for q in Q}, {"m3": Q[0:2], "m1": Q[2:4], "m2": Q[4:6]}),
        # a joining member takes one queue from each of the two that hold most
        (
            ["m1", "m2", "m3", "m4"],
            {Q[0]: "m1", Q[3]: "m1", Q[1]: "m2", Q[4]: "m2", Q[2]: "m3", Q[5]: "m3"},
            {"m1": [Q[0], Q[3]], "m2": [Q[1], Q[4]], "m3": [Q[2]], "m4": [Q[5]]},
        ),
        # the owner of a queue that is no longer live counts as no owner
        (["m1"], {Q[0]: "gone"}, {"m1": Q}),
    ],
)
def test_sticky_assign_table(
    members: list[str], owners: dict[ho.Queue, str], expected: dict[str, list[ho.Queue]]
) -> None:
    target = ho.sticky_assign(reversed(members), reversed(Q), owners)
    assert {m: sorted(q for q, o in target.items() if o == m) for m in members} == expected


def test_sticky_assign_without_members_assigns_nothing() -> None:
    assert ho.sticky_assign([], Q, {}) == {}


def test_owner_keys_round_trip_and_junk_is_skipped() -> None:
    prefix = ho.owners_prefix("g", "t")
    key = ho.owner_key("g", "t", ("broker-a", 3))
    assert key == "group/g/owners/t/broker-a/3"
    entries = [
        (key, b"m1", 7),
        (prefix + "broker-a/x", b"m1", 1),
        (prefix + "5", b"m1", 1),
        (key + "0", b"", 1),
    ]
    assert ho.parse_owners(entries, prefix) == {("broker-a", 3): ho.Owner("m1", 7)}


def test_a_member_takes_only_unowned_queues_and_waits_for_live_holders() -> None:
    # m2 joins; m1 (live) still holds everything: m2 waits, m1 releases what m2 should get.
    owners = owners_of({q: "m1" for q in Q})
    p2 = ho.plan("m2", ["m1", "m2"], Q, owners, [])
    assert p2 == ho.Plan()
    p1 = ho.plan("m1", ["m1", "m2"], Q, owners, Q)
    assert p1.release == tuple(Q[3:]) and not p1.take and not p1.lost
    # after m1 released them (keys deleted), m2 creates their keys
    released = {q: o for q, o in owners.items() if q not in p1.release}
    assert ho.plan("m2", ["m1", "m2"], Q, released, []).take == tuple(Q[3:])
    assert ho.plan("m1", ["m1", "m2"], Q, released, Q[:3]) == ho.Plan()


def test_a_holder_whose_session_expired_is_taken_over_at_its_version() -> None:
    owners = {Q[0]: ho.Owner("dead", 4), Q[1]: ho.Owner("m1", 2)}
    p = ho.plan("m1", ["m1"], Q[:2], owners, [Q[1]])
    assert p.take_over == ((Q[0], 4),) and not p.take and not p.release


def test_keys_naming_this_member_that_it_does_not_read_are_adopted() -> None:
    p = ho.plan("m1", ["m1"], Q[:2], owners_of({Q[0]: "m1"}), [])
    assert p.adopt == (Q[0],) and p.take == (Q[1],)


def test_a_queue_whose_key_another_member_holds_is_lost_at_once() -> None:
    # m1's session expired and m2 took its queue over: m1 stops reading it without committing
    p = ho.plan("m1", ["m1", "m2"], Q[:2], owners_of({Q[0]: "m2"}), [Q[0]])
    assert p.lost == (Q[0],) and not p.release
    assert ho.plan("m1", ["m1"], Q[:1], {}, [Q[0]]).lost == (Q[0],)


def test_a_revoked_queue_still_held_is_resumed_when_the_target_gives_it_back() -> None:
    # m1 revoked Q[1] for m2 but its commit was deferred; m2 left before taking it
    owners = owners_of({Q[0]: "m1", Q[1]: "m1"})
    p = ho.plan("m1", ["m1"], Q[:2], owners, Q[:2], revoked=[Q[1]])
    assert p.resume == (Q[1],) and not p.release
    still = ho.plan("m1", ["m1", "m2"], Q[:2], owners, Q[:2], revoked=[Q[1]])
    assert still.release == (Q[1],) and not still.resume


def test_a_member_that_is_not_live_releases_everything() -> None:
    owners = owners_of({Q[0]: "m1", Q[1]: "m1"})
    assert ho.plan("m1", ["m2"], Q[:2], owners, Q[:2]).release == tuple(Q[:2])


def test_a_queue_that_left_the_route_is_released() -> None:
    owners = owners_of({Q[0]: "m1", ("gone", 0): "m1"})
    assert ho.plan("m1", ["m1"], Q[:1], owners, [Q[0], ("gone", 0)]).release == (("gone", 0),)


member_ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=7, unique=True)


def balanced(members: list[str], n_queues: int, seed: list[str]) -> dict[ho.Queue, str]:
    """A balanced assignment reached by sticky_assign from arbitrary (possibly stale) owners."""
    queues = [("s", i) for i in range(n_queues)]
    return ho.sticky_assign(members, queues, dict(zip(queues, seed, strict=False)))


@settings(max_examples=300, deadline=None)
@given(members=member_ids, n_queues=st.integers(0, 20), seed=st.lists(st.text("abcdefghz", max_size=3)))
def test_every_queue_has_one_live_owner_and_shares_differ_by_at_most_one(
    members: list[str], n_queues: int, seed: list[str]
) -> None:
    target = balanced(members, n_queues, seed)
    assert sorted(target) == [("s", i) for i in range(n_queues)]
    assert set(target.values()) <= set(members)
    shares = [counts(target).get(m, 0) for m in members]
    assert max(shares) - min(shares) <= 1
    # stable: recomputing from the result changes nothing
    assert ho.sticky_assign(members, target, target) == target


@settings(max_examples=300, deadline=None)
@given(
    members=member_ids,
    n_queues=st.integers(0, 20),
    seed=st.lists(st.text("abcdefgh", max_size=3)),
    newcomer=st.text("ijk", min_size=1, max_size=3),
)
def test_a_join_moves_the_fewest_queues(
    members: list[str], n_queues: int, seed: list[str], newcomer: str
) -> None:
    before = balanced(members, n_queues, seed)
    after = ho.sticky_assign([*members, newcomer], before, before)
    # the newcomer must get its share, the smallest one; nothing else moves
    assert ho.moves(before, after) == n_queues // (len(members) + 1)
    assert all(after[q] in (m, newcomer) for q, m in before.items())


@settings(max_examples=300, deadline=None)
@given(
    members=member_ids.filter(lambda ms: len(ms) > 1),
    n_queues=st.integers(0, 20),
    seed=st.lists(st.text("abcdefgh", max_size=3)),
    data=st.data(),
)
def test_a_leave_moves_only_the_queues_of_the_member_that_left(
    members: list[str], n_queues: int, seed: list[str], data: st.DataObject
) -> None:
    before = balanced(members, n_queues, seed)
    leaving = data.draw(st.sampled_from(members))
    after = ho.sticky_assign([m for m in members if m != leaving], before, before)
    assert ho.moves(before, after) == counts(before).get(leaving, 0)
