"""SyncStateSet upkeep on the master: docs/reference/rocketmq-controller-ha.md §3.5 scenarios as tables, plus an event-sequence property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.ha.syncstate import Proposal, SyncStateTracker

M = 0  # the master


def tracker(sss=frozenset({M}), epoch=1, now=0, **kw) -> SyncStateTracker:
    return SyncStateTracker(M, frozenset(sss), epoch, now_ms=now, **kw)


def ack(
    tr: SyncStateTracker,
    slave: int,
    slave_max: int,
    *,
    now: int,
    master_max: int = 100,
    last_sent: int | None = None,
    last_sent_ms: int | None = None,
    confirm: int = 100,
    epoch_start: int = 0,
) -> Proposal | None:
    return tr.on_ack(
        slave,
        slave_max,
        now_ms=now,
        master_max=master_max,
        last_sent_master_max=master_max if last_sent is None else last_sent,
        last_sent_ms=now if last_sent_ms is None else last_sent_ms,
        confirm_offset=confirm,
        epoch_start=epoch_start,
    )


# --- expand -------------------------------------------------------------------------------


def test_expand_when_caught_up_to_confirm_and_epoch_start():
    tr = tracker()
    p = ack(tr, 1, 100, now=10, master_max=100, confirm=100, epoch_start=60)
    assert p == Proposal(frozenset({M, 1}), 1)
    assert tr.pending == p
    assert tr.local == {M}  # not until the controller confirms
    assert tr.effective == {M, 1}  # but acks and confirm already wait for the newcomer


@pytest.mark.parametrize(
    ("name", "slave_max", "last_sent", "confirm", "epoch_start"),
    [
        ("lagging behind what was sent", 90, 100, 50, 0),
        ("below the confirm offset", 90, 80, 95, 0),
        ("below the current epoch's start", 40, 40, 30, 50),
    ],
)
def test_no_expand(name, slave_max, last_sent, confirm, epoch_start):
    tr = tracker()
    assert (
        ack(tr, 1, slave_max, now=10, last_sent=last_sent, confirm=confirm, epoch_start=epoch_start) is None
    )
    assert tr.pending is None and tr.effective == {M}


def test_no_second_proposal_while_one_is_pending():
    tr = tracker()
    assert ack(tr, 1, 100, now=10) is not None
    assert ack(tr, 2, 100, now=11) is None
    assert tr.effective == {M, 1}


def test_confirmed_expansion_becomes_local():
    tr = tracker()
    ack(tr, 1, 100, now=10)
    assert tr.on_controller_state(frozenset({M, 1}), 2)
    assert tr.local == tr.effective == {M, 1}
    assert tr.pending is None and tr.sss_epoch == 2
    # now the other slave may join, proposed against the new epoch
    assert ack(tr, 2, 100, now=11) == Proposal(frozenset({M, 1, 2}), 2)


def test_a_member_acking_proposes_nothing():
    tr = tracker({M, 1})
    assert ack(tr, 1, 100, now=10) is None


# --- caught-up bookkeeping ----------------------------------------------------------------


def test_caught_up_time_is_now_at_the_masters_end_else_the_last_send():
    tr = tracker({M, 1})
    ack(tr, 1, 100, now=500, master_max=100)
    assert tr.caught_up_ms(1) == 500
    # it has all that was sent at t=600, but the master has written more since
    ack(tr, 1, 150, now=700, master_max=200, last_sent=150, last_sent_ms=600)
    assert tr.caught_up_ms(1) == 600
    # lagging acks do not count; and the time never goes back
    ack(tr, 1, 160, now=900, master_max=300, last_sent=250, last_sent_ms=800)
    ack(tr, 1, 250, now=950, master_max=300, last_sent=250, last_sent_ms=100)
    assert tr.caught_up_ms(1) == 600


# --- shrink -------------------------------------------------------------------------------


def test_shrink_after_15_s_without_catching_up():
    tr = tracker({M, 1})
    ack(tr, 1, 100, now=1_000)
    assert tr.check_shrink(now_ms=16_000) is None  # exactly 15 s: still in (strictly more is needed)
    assert tr.check_shrink(now_ms=16_001) == Proposal(frozenset({M}), 1)
    assert tr.local == tr.effective == {M, 1}  # until the controller confirms


def test_catching_up_again_keeps_the_member():
    tr = tracker({M, 1})
    ack(tr, 1, 100, now=1_000)
    ack(tr, 1, 200, now=14_000, master_max=200)
    assert tr.check_shrink(now_ms=20_000) is None


def test_a_member_never_seen_counts_from_tracker_creation():
    # a restarted master gives its slaves the full grace to reconnect (RocketMQ drops them at once)
    tr = tracker({M, 1}, now=5_000)
    assert tr.check_shrink(now_ms=20_000) is None
    assert tr.check_shrink(now_ms=20_001) == Proposal(frozenset({M}), 1)


def test_a_member_added_by_the_controller_counts_from_when_it_was_added():
    tr = tracker(now=0)
    assert tr.on_controller_state(frozenset({M, 3}), 2, now_ms=10_000)
    assert tr.check_shrink(now_ms=25_000) is None
    assert tr.check_shrink(now_ms=25_001) == Proposal(frozenset({M}), 2)


def test_shrink_with_a_configured_limit():
    tr = tracker({M, 1, 2}, max_not_catchup_ms=1_000)
    ack(tr, 2, 100, now=900)
    assert tr.check_shrink(now_ms=1_500) == Proposal(frozenset({M, 2}), 1)


# --- disconnect ---------------------------------------------------------------------------


def test_disconnect_proposes_removal():
    tr = tracker({M, 1, 2})
    p = tr.on_disconnect(1, now_ms=10)
    assert p == Proposal(frozenset({M, 2}), 1)
    # a shrink is not applied until confirmed: the leaving member may still be elected
    assert tr.effective == tr.local == {M, 1, 2}


def test_disconnect_of_a_non_member_proposes_nothing():
    tr = tracker({M, 1})
    assert tr.on_disconnect(7, now_ms=10) is None


def test_disconnect_while_pending_is_proposed_by_the_next_check():
    tr = tracker({M, 1})
    ack(tr, 2, 100, now=10)  # expansion {M, 1, 2} pending
    assert tr.on_disconnect(1, now_ms=20) is None  # one proposal at a time
    assert tr.effective == {M, 1, 2}
    tr.on_alter_failed()
    assert tr.check_shrink(now_ms=30) == Proposal(frozenset({M}), 1)


def test_an_ack_after_reconnecting_cancels_the_remembered_disconnect():
    tr = tracker({M, 1})
    ack(tr, 2, 100, now=10)
    tr.on_disconnect(1, now_ms=20)
    ack(tr, 1, 100, now=25)
    tr.on_alter_failed()
    assert tr.check_shrink(now_ms=30) is None


# --- controller state and failures --------------------------------------------------------


def test_effective_is_the_union_while_pending():
    tr = tracker({M, 1}, epoch=4)
    ack(tr, 2, 100, now=10)
    assert tr.effective == {M, 1, 2} and tr.local == {M, 1}
    tr.on_alter_failed()
    assert tr.effective == {M, 1} and tr.pending is None


def test_stale_controller_state_is_ignored():
    tr = tracker({M, 1}, epoch=5)
    assert not tr.on_controller_state(frozenset({M}), 4)
    assert tr.local == {M, 1} and tr.sss_epoch == 5


def test_same_epoch_does_not_end_a_pending_proposal():
    # the proposal may still be applied at the controller; only a newer epoch or a refusal ends it
    tr = tracker({M}, epoch=5)
    p = ack(tr, 1, 100, now=10)
    assert not tr.on_controller_state(frozenset({M}), 5)
    assert tr.pending == p and tr.effective == {M, 1}
    assert not tr.on_controller_state(
        frozenset({M, 9}), 5
    )  # same epoch, other set: not from a sane controller
    assert tr.local == {M}


def test_a_newer_state_ends_the_pending_proposal_whatever_it_says():
    tr = tracker({M, 1}, epoch=5)
    ack(tr, 2, 100, now=10)
    assert tr.on_controller_state(frozenset({M, 3}), 7)  # someone else's change won
    assert tr.local == tr.effective == {M, 3} and tr.pending is None


def test_alter_failed_lets_a_later_ack_propose_again():
    tr = tracker()
    p = ack(tr, 1, 100, now=10)
    tr.on_alter_failed()
    assert ack(tr, 1, 100, now=20) == p


# --- the master stays ---------------------------------------------------------------------


def test_the_master_is_never_removed():
    tr = tracker({M, 1}, now=0)
    assert tr.on_disconnect(M, now_ms=10) is None
    ack(tr, 1, 100, now=10)
    # the master never acks itself; it must not count as stale
    assert tr.check_shrink(now_ms=10_000_000) == Proposal(frozenset({M}), 1)
    tr.on_alter_failed()
    # a set without this master means it was demoted: the role handling acts, not the tracker
    assert not tr.on_controller_state(frozenset({1}), 9)
    assert M in tr.local


def test_the_master_must_start_in_its_set():
    with pytest.raises(ValueError):
        SyncStateTracker(M, frozenset({1}), 1, now_ms=0)


# --- property: random event sequences against a controller that applies or refuses ------------

EVENTS = st.one_of(
    st.tuples(
        st.just("ack"),
        st.integers(1, 4),
        st.integers(0, 200),
        st.integers(0, 200),
        st.integers(0, 200),
        st.integers(0, 200),
    ),
    st.tuples(st.just("disconnect"), st.integers(0, 4)),
    st.tuples(st.just("check"), st.integers(0, 20_000)),
    st.tuples(st.just("apply")),
    st.tuples(st.just("refuse")),
    st.tuples(st.just("state"), st.frozensets(st.integers(0, 4)), st.integers(-1, 2)),
)


@settings(max_examples=300)
@given(events=st.lists(EVENTS, max_size=40), initial=st.frozensets(st.integers(1, 4)))
def test_invariants_over_random_event_sequences(events, initial):
    tr = SyncStateTracker(M, initial | {M}, 1, max_not_catchup_ms=5_000, now_ms=0)
    now = 0
    for event in events:
        kind = event[0]
        before_pending = tr.pending
        before_epoch = tr.sss_epoch
        proposal = None
        now += 100
        if kind == "ack":
            _, slave, slave_max, master_max, confirm, start = event
            proposal = tr.on_ack(
                slave,
                slave_max,
                now_ms=now,
                master_max=master_max,
                last_sent_master_max=min(master_max, slave_max + 10),
                last_sent_ms=now - 50,
                confirm_offset=confirm,
                epoch_start=start,
            )
        elif kind == "disconnect":
            proposal = tr.on_disconnect(event[1], now_ms=now)
        elif kind == "check":
            now += event[1]
            proposal = tr.check_shrink(now_ms=now)
        elif kind == "apply" and tr.pending is not None:
            assert tr.on_controller_state(tr.pending.new_sync_state_set, tr.pending.sss_epoch + 1)
        elif kind == "refuse":
            tr.on_alter_failed()
        elif kind == "state":
            tr.on_controller_state(event[1], tr.sss_epoch + event[2])

        assert M in tr.local and M in tr.effective
        assert tr.local <= tr.effective
        assert tr.sss_epoch >= before_epoch
        if tr.pending is not None:
            assert M in tr.pending.new_sync_state_set
            assert tr.pending.sss_epoch == tr.sss_epoch
            assert tr.pending.new_sync_state_set != tr.local
        else:
            assert tr.effective == tr.local
        if proposal is not None:
            assert before_pending is None  # at most one proposal in flight
            assert proposal == tr.pending
            assert M in proposal.new_sync_state_set
