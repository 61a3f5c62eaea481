"""The leader's heartbeat table (docs/reference/rocketmq-controller-ha.md §2.3, RULES.md §7)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.controller.liveness import HeartbeatTable
from tidelog.controller.state import (
    AlterSyncStateSet,
    ControllerState,
    ElectMaster,
    LiveInfo,
    RegisterBroker,
)
from tidelog.ha.lease import prior_leader_lease_ms

A, B = "broker-a", "broker-b"
T = 5000


def test_l1_alive_until_exactly_the_timeout() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 0, 0, -1, now_ms=1000)
    assert hb.is_alive(A, 1, 1000)
    assert hb.is_alive(A, 1, 1000 + T)  # last + timeout >= now
    assert not hb.is_alive(A, 1, 1000 + T + 1)
    assert not hb.is_alive(A, 2, 1000) and not hb.is_alive(B, 1, 1000)


def test_l1_alive_snapshot_is_per_set_and_sorted() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 3, 1, 30, 20, now_ms=0, priority=7)
    hb.beat(A, 1, 1, 10, 5, now_ms=0)
    hb.beat(B, 2, 1, 99, 0, now_ms=0)
    hb.beat(A, 2, 1, 20, 5, now_ms=-T)  # already stale at now=1
    alive = hb.alive(A, 1)
    assert list(alive) == [1, 3]
    assert alive[3] == LiveInfo(1, 30, 20, 7)
    assert hb.alive_ids(B, 1) == {2}


def test_l2_epoch_and_offset_never_decrease() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 2, 500, 400, now_ms=0)
    hb.beat(A, 1, 2, 300, 100, now_ms=10)  # smaller offset, same epoch: a delayed heartbeat
    assert hb.info(A, 1) == LiveInfo(2, 500, 400)
    hb.beat(A, 1, 1, 9999, 9999, now_ms=20)  # older epoch, larger offset
    assert hb.info(A, 1) == LiveInfo(2, 500, 400)
    hb.beat(A, 1, 3, 0, 0, now_ms=30)  # newer epoch wins even with a smaller offset
    assert hb.info(A, 1) == LiveInfo(3, 0, 0)


def test_l2_equal_pair_raises_confirm_offset_only_upward() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 2, 500, 100, now_ms=0)
    hb.beat(A, 1, 2, 500, 300, now_ms=1)
    hb.beat(A, 1, 2, 500, 200, now_ms=2)
    assert hb.info(A, 1).confirm_offset == 300


def test_l2_priority_and_last_seen_refresh_on_every_beat() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 2, 500, 100, now_ms=0, priority=9)
    hb.beat(A, 1, 1, 0, 0, now_ms=4000, priority=1)  # stale pair, but still a sign of life
    assert hb.info(A, 1).priority == 1
    assert hb.is_alive(A, 1, 4000 + T)


def test_l2_a_delayed_heartbeat_does_not_move_last_seen_back() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 0, 0, 0, now_ms=8000)
    hb.beat(A, 1, 0, 0, 0, now_ms=1000)
    assert hb.is_alive(A, 1, 8000 + T)


def test_l3_expire_removes_and_returns_dead_entries_in_order() -> None:
    hb = HeartbeatTable(T)
    hb.beat(B, 1, 0, 0, 0, now_ms=0)
    hb.beat(A, 2, 0, 0, 0, now_ms=0)
    hb.beat(A, 1, 0, 0, 0, now_ms=3000)
    assert hb.expire(T) == []
    assert hb.expire(T + 1) == [(A, 2), (B, 1)]
    assert len(hb) == 1 and hb.info(A, 2) is None
    assert hb.expire(T + 1) == []


def test_l3_expired_entry_starts_fresh_and_may_report_lower_offsets() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 5, 900, 0, now_ms=0)
    hb.expire(T + 1)
    hb.beat(A, 1, 4, 100, 0, now_ms=T + 2)  # e.g. truncated after a fork
    assert hb.info(A, 1) == LiveInfo(4, 100, 0)


def test_l3_forget_one_broker_or_a_whole_set() -> None:
    hb = HeartbeatTable(T)
    for i in (1, 2):
        hb.beat(A, i, 0, 0, 0, now_ms=0)
    hb.beat(B, 1, 0, 0, 0, now_ms=0)
    hb.forget(A, 2)
    assert hb.alive_ids(A, 0) == {1}
    hb.forget(A)
    assert hb.alive_ids(A, 0) == frozenset() and hb.alive_ids(B, 0) == {1}
    hb.forget("nope", 9)  # harmless


def mastered_state() -> ControllerState:
    s = ControllerState()
    for i in (1, 2):
        s.apply(RegisterBroker(A, f"10.0.0.{i}:1", f"10.0.0.{i}:2", identity=f"i{i}"))
    alive = {1: LiveInfo(0, 0), 2: LiveInfo(0, 0)}
    assert s.apply(ElectMaster(A, 1, alive=alive)).ok
    assert s.apply(AlterSyncStateSet(A, 1, 1, frozenset({1, 2}), 1, alive=frozenset({1, 2}))).ok
    s.apply(RegisterBroker(B, "10.0.1.1:1", "10.0.1.1:2", identity="b1"))  # no master yet
    return s


def test_l5_master_dead_and_a_member_alive_needs_election() -> None:
    s = mastered_state()
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 1, 0, 0, now_ms=0)
    hb.beat(A, 2, 1, 0, 0, now_ms=0)
    hb.beat(B, 1, 0, 0, 0, now_ms=0)
    assert hb.masters_needing_election(s, 100) == []  # master alive
    hb.beat(A, 2, 1, 0, 0, now_ms=4000)
    hb.beat(B, 1, 0, 0, 0, now_ms=4000)
    assert hb.masters_needing_election(s, T + 1) == [A]  # master 1 silent; B has no master
    # the election the leader then runs
    r = s.apply(ElectMaster(A, None, alive=hb.alive(A, T + 1)))
    assert r.ok and r.value.master_id == 2
    assert hb.masters_needing_election(s, T + 1) == []


def test_l5_master_dead_and_nobody_alive_is_not_an_election() -> None:
    s = mastered_state()
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 1, 0, 0, now_ms=0)
    hb.beat(A, 2, 1, 0, 0, now_ms=0)
    assert hb.masters_needing_election(s, T + 1) == []


def test_l4_new_leader_grace_declares_nobody_dead_for_one_timeout() -> None:
    s = mastered_state()
    hb = HeartbeatTable(T)  # a fresh leader: empty table
    hb.on_leadership(now_ms=100_000)
    hb.beat(A, 2, 1, 0, 0, now_ms=100_010)  # the slave finds the new leader first
    assert hb.in_grace(100_010)
    assert hb.masters_needing_election(s, 100_000 + T - 1) == []
    # grace ends; the master never showed up: now it is dead
    hb.beat(A, 2, 1, 0, 0, now_ms=100_000 + T)
    assert hb.masters_needing_election(s, 100_000 + T) == [A]


def test_l4_grace_does_not_make_unheard_brokers_alive() -> None:
    hb = HeartbeatTable(T)
    hb.on_leadership(now_ms=0)
    assert not hb.is_alive(A, 1, 1)
    assert hb.alive(A, 1) == {}


def test_l4_grace_keeps_what_the_node_heard_as_a_follower() -> None:
    hb = HeartbeatTable(T)
    hb.beat(A, 1, 0, 0, 0, now_ms=0)
    hb.on_leadership(now_ms=4000)  # an entry heard as a follower keeps its real age
    assert hb.is_alive(A, 1, T)
    assert hb.expire(T + 1) == [(A, 1)]


def follower_heard(until_ms: int, master_until_ms: int, step: int = 500) -> HeartbeatTable:
    """A follower that received the copies of broker-a's slave (2) up to `until_ms` and of its
    master (1) up to `master_until_ms`, from time 0."""
    hb = HeartbeatTable(T)
    for now in range(0, until_ms + 1, step):
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
        if now <= master_until_ms:
            hb.beat(A, 1, 1, 0, 0, now_ms=now)
    return hb


def test_l4_witnessed_silence_fails_the_master_over_within_the_grace() -> None:
    # The leader's datacenter went dark at 10 s together with the master; this follower heard
    # the slave throughout, takes over at 11.5 s and need not wait until the grace ends, only
    # until no lease the old leader granted can still run.
    s = mastered_state()
    leads = 11_500
    hb = follower_heard(until_ms=leads + T, master_until_ms=10_000)
    hb.on_leadership(now_ms=leads)
    after_leases = leads + prior_leader_lease_ms(T)
    assert hb.in_grace(after_leases) and after_leases > 10_000 + T
    assert hb.masters_needing_election(s, after_leases - 1) == []  # an old lease may still run
    assert hb.masters_needing_election(s, after_leases) == [A]


def test_l4_witnessed_silence_waits_out_the_leases_an_earlier_leader_granted() -> None:
    """The simulator's seed 2144: this node heard nobody for 2.3 s (shorter than the timeout, so
    the slave's run did not break); soon after, the master and the old leader were cut off
    together. The master was silent to this node for a full timeout, but for only 2 s in truth,
    and the lease the old leader granted it before losing its majority still ran."""
    s = mastered_state()
    hb = HeartbeatTable(T)
    for now in range(0, 45_000, 500):  # the last heartbeat of the master this node hears: 44.5 s
        hb.beat(A, 1, 1, 0, 0, now_ms=now)
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
    for now in range(47_500, 60_000, 500):  # deaf from 45 s to 47.3 s; the master cut off since
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
    leads = 48_000
    hb.on_leadership(now_ms=leads)
    # past the master's timeout, and the slave's run (a 2.5 s gap) counts as unbroken
    assert not hb.is_alive(A, 1, 49_600) and hb.in_grace(49_600)
    assert hb.masters_needing_election(s, 49_600) == []
    assert hb.masters_needing_election(s, leads + prior_leader_lease_ms(T)) == [A]


def test_l4_a_witness_must_have_been_heard_for_a_full_timeout() -> None:
    # This node was cut off from the brokers until 20 s and hears the slave again from then on:
    # the master may be beating just as well, so within the grace nobody is declared dead.
    s = mastered_state()
    hb = follower_heard(until_ms=5_000, master_until_ms=5_000)
    for now in range(20_000, 20_000 + T, 500):
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
    hb.on_leadership(now_ms=20_000)
    assert hb.masters_needing_election(s, 20_000 + T - 500) == []
    hb.beat(A, 2, 1, 0, 0, now_ms=20_000 + T)
    assert hb.masters_needing_election(s, 20_000 + T) == [A]  # the grace is over


def test_l4_a_restarted_leader_has_no_witness() -> None:
    s = mastered_state()
    hb = HeartbeatTable(T)
    hb.on_leadership(now_ms=0)
    for now in range(0, T, 500):
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
    assert hb.masters_needing_election(s, T - 1) == []


def paused_leader() -> HeartbeatTable:
    """A leader since 0 whose loop turns every 250 ms until 2 s, hearing broker-a's master (1) at
    0.4 s, 1.4 s and its slave (2) at 0.9 s, 1.9 s; then its process stops."""
    hb = HeartbeatTable(T)
    hb.on_leadership(now_ms=0)
    for now in range(0, 2001, 250):
        assert not hb.on_tick(now)
    for now in (400, 900, 1400, 1900):
        hb.beat(A, 1 if now % 1000 == 400 else 2, 1, 0, 0, now_ms=now)
    return hb


def test_l9_a_paused_leader_does_not_fail_over_on_silence_it_did_not_witness() -> None:
    # Resuming at 6.466 s, the table shows the master silent past its timeout and the slave alive
    # and heard since 0.9 s: without L9 that is witnessed silence, and the master is failed over.
    s = mastered_state()
    hb = paused_leader()
    assert hb.on_tick(6466)
    assert hb.in_grace(6466) and hb.in_grace(6466 + T - 1)
    assert hb.masters_needing_election(s, 6466) == []
    # the heartbeats that queued during the pause arrive; the master lives and beats on
    for now in range(6470, 6466 + 3 * T, 1000):
        hb.beat(A, 1, 1, 0, 0, now_ms=now)
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
        assert hb.masters_needing_election(s, now) == []


def test_l9_a_master_that_died_is_failed_over_once_the_new_grace_ends() -> None:
    s = mastered_state()
    hb = paused_leader()
    assert hb.on_tick(6466)
    for now in range(6466, 6466 + T, 250):
        hb.beat(A, 2, 1, 0, 0, now_ms=now)
        assert hb.masters_needing_election(s, now) == []  # the slave is no witness yet
    hb.beat(A, 2, 1, 0, 0, now_ms=6466 + T)
    assert hb.masters_needing_election(s, 6466 + T) == [A]


def test_l9_only_a_gap_of_half_the_timeout_counts() -> None:
    hb = HeartbeatTable(T)
    hb.on_leadership(now_ms=0)
    assert hb.tick_gap_ms == T // 2
    assert not hb.on_tick(T // 2 - 1)  # a slow turn: still listening
    assert not hb.in_grace(T + 1)
    assert hb.on_tick(T - 1 + T // 2)
    assert hb.in_grace(T - 1 + T // 2 + T - 1)


def test_l9_a_new_leadership_is_not_a_gap() -> None:
    # A follower that led long ago and leads again keeps what it witnessed as a follower (L4).
    s = mastered_state()
    hb = follower_heard(until_ms=10_000 + T, master_until_ms=10_000)
    hb.on_leadership(now_ms=0)
    assert not hb.on_tick(0)
    hb.on_leadership(now_ms=11_500)
    assert not hb.on_tick(11_500)
    assert hb.masters_needing_election(s, 11_500 + prior_leader_lease_ms(T)) == [A]


def test_touch_refreshes_only_a_known_entry() -> None:
    hb = HeartbeatTable(T)
    hb.touch(A, 1, now_ms=0)
    assert hb.info(A, 1) is None
    hb.beat(A, 1, 1, 100, 50, now_ms=0)
    hb.touch(A, 1, now_ms=T)
    assert hb.is_alive(A, 1, 2 * T) and hb.info(A, 1).max_offset == 100


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_timeout_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError):
        HeartbeatTable(bad)  # type: ignore[arg-type]


beats = st.lists(
    st.tuples(st.integers(-1, 3), st.integers(-1, 1000), st.integers(-1, 1000), st.integers(0, 20_000)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(beats)
def test_l2_stored_pair_is_the_running_maximum_while_alive(seq) -> None:
    hb = HeartbeatTable(10**9)  # nothing expires: one entry lives throughout
    best = None
    for epoch, offset, confirm, now in seq:
        hb.beat(A, 1, epoch, offset, confirm, now)
        best = max(best or (epoch, offset), (epoch, offset))
        info = hb.info(A, 1)
        assert (info.epoch, info.max_offset) == best


def no_master_state() -> ControllerState:
    """broker-a after a failed controller-triggered election: no master, SyncStateSet {1, 2}."""
    s = mastered_state()
    r = s.apply(ElectMaster(A, None, alive={}))
    assert r.code == "CONTROLLER_MASTER_NOT_AVAILABLE" and s.broker_sets[A].master_id is None
    return s


def test_l6_leaderless_set_is_listed_once_a_sss_member_is_back() -> None:
    s = no_master_state()
    hb = HeartbeatTable(T)
    assert hb.leaderless_sets_electable(s, 0, enable_unclean=False) == []
    hb.beat(A, 2, 1, 0, 0, now_ms=0)
    hb.beat(B, 1, 0, 0, 0, now_ms=0)  # broker-b never had a master: the brokers' first election
    assert hb.leaderless_sets_electable(s, 1, enable_unclean=False) == [A]
    assert s.apply(ElectMaster(A, None, alive=hb.alive(A, 1))).ok
    assert hb.leaderless_sets_electable(s, 1, enable_unclean=False) == []


def test_l6_only_non_sss_members_alive_needs_unclean() -> None:
    s = no_master_state()
    s.apply(RegisterBroker(A, "10.0.0.3:1", "10.0.0.3:2", identity="i3"))
    hb = HeartbeatTable(T)
    hb.beat(A, 3, 0, 0, 0, now_ms=0)
    assert hb.leaderless_sets_electable(s, 1, enable_unclean=False) == []
    assert hb.leaderless_sets_electable(s, 1, enable_unclean=True) == [A]


def test_l6_not_during_grace() -> None:
    s = no_master_state()
    hb = HeartbeatTable(T)
    hb.on_leadership(0)
    hb.beat(A, 2, 1, 0, 0, now_ms=1)
    assert hb.leaderless_sets_electable(s, T - 1, enable_unclean=False) == []
    hb.beat(A, 2, 1, 0, 0, now_ms=T)
    assert hb.leaderless_sets_electable(s, T, enable_unclean=False) == [A]
