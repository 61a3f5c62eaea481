"""The election policy (docs/reference/rocketmq-controller-ha.md §2.1, RULES.md §3), as tables.

Each row: (scenario, sync_state_set, all_members, old_master, preferred, alive, unclean, expected).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.controller.election import elect
from tidelog.controller.state import LiveInfo

L = LiveInfo


def live(*ids: int, epoch: int = 1, offset: int = 100) -> dict[int, LiveInfo]:
    return {i: L(epoch, offset) for i in ids}


CASES = [
    # P1: only alive candidates count
    ("p1_nobody_alive", {1, 2}, {1, 2, 3}, 1, None, {}, False, None),
    ("p1_dead_sss_members_skipped", {1, 2}, {1, 2}, 1, None, live(2), False, 2),
    ("p1_alive_non_member_of_pass_ignored", {1}, {1, 2}, 1, None, live(2), False, None),
    # P2: old master alive and nobody else preferred -> old master
    ("p2_old_master_alive_kept", {1, 2}, {1, 2}, 1, None, {1: L(1, 10), 2: L(5, 999)}, False, 1),
    ("p2_old_master_preferred_kept", {1, 2}, {1, 2}, 1, 1, live(1, 2), False, 1),
    ("p2_old_master_outside_sss_not_kept", {2}, {1, 2}, 1, None, live(1, 2), False, 2),
    # P3: preferred broker, no fallback within the pass
    ("p3_preferred_alive_in_sss_wins_over_alive_master", {1, 2}, {1, 2}, 1, 2, live(1, 2), False, 2),
    ("p3_preferred_dead_no_fallback", {1, 2, 3}, {1, 2, 3}, 1, 2, live(1, 3), False, None),
    ("p3_preferred_outside_sss_clean_fails", {1}, {1, 2}, 1, 2, live(1, 2), False, None),
    ("p3_preferred_outside_sss_unclean_found", {1}, {1, 2}, 1, 2, live(1, 2), True, 2),
    ("p3_preferred_unknown_nobody", {1, 2}, {1, 2}, None, 9, live(1, 2, 9), True, None),
    # P4: order epoch desc, max_offset desc, priority asc, broker id asc
    ("p4_higher_epoch_wins", {1, 2}, {1, 2}, None, None, {1: L(3, 10), 2: L(2, 10_000)}, False, 1),
    ("p4_higher_offset_wins", {1, 2}, {1, 2}, None, None, {1: L(3, 10), 2: L(3, 11)}, False, 2),
    (
        "p4_lower_priority_value_wins",
        {1, 2},
        {1, 2},
        None,
        None,
        {1: L(3, 10, priority=5), 2: L(3, 10, priority=1)},
        False,
        2,
    ),
    ("p4_lowest_id_breaks_exact_tie", {3, 2, 7}, {2, 3, 7}, None, None, live(7, 3, 2), False, 2),
    ("p4_dead_old_master_ignored", {1, 2, 3}, {1, 2, 3}, 1, None, {2: L(4, 50), 3: L(4, 60)}, False, 3),
    # QUIRK §2.1: RocketMQ casts the offset difference to int; a gap >= 2^31 must still sort right
    ("quirk_offset_gap_beyond_int32", {1, 2}, {1, 2}, None, None, {1: L(1, 2**31 + 5), 2: L(1, 4)}, False, 1),
    (
        "quirk_offset_gap_beyond_int32_reversed",
        {1, 2},
        {1, 2},
        None,
        None,
        {1: L(1, 4), 2: L(1, 2**33)},
        False,
        2,
    ),
    # unclean off / on
    ("unclean_off_no_sss_member_alive", {1}, {1, 2, 3}, 1, None, live(2, 3), False, None),
    ("unclean_on_best_member_outside_sss", {1}, {1, 2, 3}, 1, None, {2: L(2, 5), 3: L(2, 9)}, True, 3),
    ("unclean_on_sss_member_still_first", {1, 2}, {1, 2, 3}, 1, None, {2: L(1, 5), 3: L(9, 999)}, True, 2),
    ("empty_sss_clean_fails", set(), {1, 2}, None, None, live(1, 2), False, None),
    ("empty_sss_unclean_elects", set(), {1, 2}, None, None, {1: L(0, 1), 2: L(0, 2)}, True, 2),
]


@pytest.mark.parametrize(
    "sss, members, old, preferred, alive, unclean, expected",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_2_1_election_policy(sss, members, old, preferred, alive, unclean, expected) -> None:
    assert elect(frozenset(sss), frozenset(members), old, preferred, alive, unclean) == expected


ids = st.integers(min_value=1, max_value=6)
infos = st.builds(
    LiveInfo,
    st.integers(-1, 3),
    st.integers(-1, 2**40),
    st.integers(-1, 2),
    st.sampled_from([0, 1, 2**31 - 1]),
)


@settings(max_examples=300, deadline=None)
@given(
    sss=st.frozensets(ids),
    extra=st.frozensets(ids),
    old=st.none() | ids,
    preferred=st.none() | ids,
    alive=st.dictionaries(ids, infos),
    unclean=st.booleans(),
)
def test_2_1_winner_is_alive_and_clean_winner_is_in_sss(sss, extra, old, preferred, alive, unclean) -> None:
    members = sss | extra
    winner = elect(sss, members, old, preferred, alive, unclean)
    if winner is None:
        # Nobody is only the answer when no alive candidate exists, or a preferred one is unavailable.
        pool = members if unclean else sss
        assert preferred is not None or not (pool & alive.keys())
        return
    assert winner in alive
    assert winner in (members if unclean else sss)
    if not unclean:
        assert winner in sss
    if preferred is not None and winner != old:
        assert winner == preferred
    if preferred is None and winner != old and winner in sss:
        # the winner ranks best among alive SyncStateSet members
        best = min((-alive[b].epoch, -alive[b].max_offset, alive[b].priority, b) for b in sss & alive.keys())
        assert best[3] == winner


@settings(max_examples=100, deadline=None)
@given(sss=st.frozensets(ids, min_size=1), alive=st.dictionaries(ids, infos, min_size=1))
def test_2_1_election_does_not_depend_on_input_order(sss, alive) -> None:
    reordered = dict(reversed(list(alive.items())))
    assert elect(sss, sss, None, None, alive, True) == elect(
        frozenset(sorted(sss, reverse=True)), sss, None, None, reordered, True
    )
