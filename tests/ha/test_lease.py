"""The master's right to acknowledge writes (`ha.lease`), and the argument of docs/ARCHITECTURE.md
§3.5 that lets the replication rule stand in for the lease while no controller answers: one test
(or more) per numbered step, named after it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.controller.election import elect
from tidelog.controller.model import LiveInfo
from tidelog.ha import roles
from tidelog.ha.lease import (
    DRIFT_BOUND,
    LEASE_FRACTION,
    Lease,
    LeaseFences,
    grants_lease,
    handover_wait_ms,
    majority_contact_age,
)
from tidelog.ha.mastercore import (
    Acked,
    AlterFailed,
    Appended,
    ControllerState,
    MasterCore,
    Release,
    Sent,
    SlaveJoined,
    SlaveLeft,
    Waiting,
)
from tidelog.ha.syncstate import Proposal
from tidelog.invariants import InvariantViolation

M = 0


def master(sss: frozenset[int] = frozenset({M, 1}), *, master_max: int = 100) -> MasterCore:
    return MasterCore.start(
        broker_id=M,
        epoch=2,
        sync_state_set=sss,
        sss_epoch=1,
        master_max=master_max,
        confirm=master_max,
        epoch_start=0,
        max_not_catchup_ms=1000,
        now_ms=0,
    )


# ---------------------------------------------------------------------------------- the lease

E = 4  # the master epoch the leases below are granted for


def test_lease_holds_for_a_fraction_of_the_timeout_from_when_the_heartbeat_was_sent():
    lease = Lease()
    assert not lease.holds(0, E)  # never renewed
    lease.renew(1_000, 4_000, epoch=E, unclean_elections=False)
    assert lease.holds(1_000 + int(LEASE_FRACTION * 4_000), E)
    assert not lease.holds(1_001 + int(LEASE_FRACTION * 4_000), E)


def test_a_lease_holds_only_for_the_master_epoch_it_was_granted_for():
    """The simulator's seed 6343: a lease is the controller's word that it will not replace this
    master of epoch E before the lease ends; it says nothing about another epoch."""
    lease = Lease()
    lease.renew(1_000, 4_000, epoch=E, unclean_elections=False)
    assert lease.holds(1_500, E) and not lease.holds(1_500, E + 1) and not lease.holds(1_500, E - 1)
    assert not lease.may_start(1_500, E + 1, replication="sync", needs_every_member=False)
    lease.renew(1_200, 4_000, epoch=E + 1, unclean_elections=False)  # a newer epoch replaces it
    assert lease.holds(1_500, E + 1) and not lease.holds(1_500, E)
    lease.renew(2_000, 4_000, epoch=E, unclean_elections=False)  # a late answer for the old epoch
    assert lease.epoch == E + 1 and lease.until_ms == 1_200 + 3_000


def test_a_late_answer_to_an_older_heartbeat_never_shortens_the_lease():
    lease = Lease()
    lease.renew(5_000, 4_000, epoch=E, unclean_elections=False)
    lease.renew(1_000, 4_000, epoch=E, unclean_elections=False)
    assert lease.until_ms == 5_000 + 3_000


@pytest.mark.parametrize(("fraction", "timeout"), [(0.0, 1), (1.0, 1), (0.5, 0)])
def test_a_lease_that_could_outlive_the_controllers_timeout_is_refused(fraction: float, timeout: int):
    with pytest.raises(InvariantViolation):
        Lease(fraction=fraction).renew(0, timeout, epoch=E, unclean_elections=False)


# ------------------------------------------------------------------ §3.5 step 1: clean elections


@given(
    sss=st.frozensets(st.integers(0, 4), max_size=5),
    members=st.frozensets(st.integers(0, 6), max_size=7),
    alive=st.frozensets(st.integers(0, 6), max_size=7),
    old=st.none() | st.integers(0, 6),
    preferred=st.none() | st.integers(0, 6),
)
def test_3_5_1_a_clean_election_picks_only_a_member_of_the_controllers_set(
    sss, members, alive, old, preferred
):
    live = {b: LiveInfo(epoch=1, max_offset=0) for b in alive}
    winner = elect(sss, members | sss, old, preferred, live, enable_unclean=False)
    assert winner is None or winner in sss


def test_3_5_1_a_master_alone_in_its_set_cannot_be_replaced_by_a_clean_election():
    live = {1: LiveInfo(epoch=1, max_offset=10**6)}  # the slave is alive, the master is not
    assert elect({M}, {M, 1}, M, None, live, enable_unclean=False) is None


# ------------------------------------------------------ §3.5 step 2: every set the controller may know


def test_3_5_2_an_expansion_counts_from_the_moment_it_is_proposed():
    c = master(frozenset({M}))
    c.step(SlaveJoined(1, 100), 1)
    assert c.tracker.pending == Proposal(frozenset({M, 1}), 1)
    c.step(Appended(200), 2)
    assert c.held_by_all() == 100  # the joining member does not hold 200 yet
    c.step(Sent(1, 200), 3)
    c.step(Acked(1, 200), 4)
    assert c.held_by_all() == 200


def test_3_5_2_a_shrink_counts_only_once_the_controller_confirms_it():
    c = master(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    c.step(SlaveLeft(1), 2)  # proposes {M}
    c.step(Appended(200), 3)
    assert c.held_by_all() == -1  # member 1 may still be elected, and is gone: nothing is covered
    c.step(ControllerState(frozenset({M}), 2), 4)
    assert c.held_by_all() == 200


def test_3_5_2_a_late_refusal_of_an_overtaken_proposal_keeps_the_newer_one_counted():
    c = master(frozenset({M}))
    c.step(SlaveJoined(1, 100), 1)
    first = c.tracker.pending
    assert first is not None
    c.step(ControllerState(frozenset({M, 1}), 2), 2)  # applied
    c.step(SlaveJoined(2, 100), 3)  # a newer expansion from set epoch 2
    newer = c.tracker.pending
    assert newer is not None and 2 in newer.new_sync_state_set
    c.step(AlterFailed(first, 1), 4)  # the late answer about the first one
    assert c.tracker.pending == newer and 2 in c.tracker.effective


# ------------------------------------------- §3.5 step 3: what the rule releases, every member holds


@given(
    acks=st.dictionaries(st.integers(1, 3), st.integers(0, 300), max_size=3),
    master_max=st.integers(100, 300),
    needed=st.integers(1, 4),
)
def test_3_5_3_a_release_past_the_confirmed_quorum_is_held_by_every_member(acks, master_max, needed):
    c = master(frozenset({M, 1, 2, 3}), master_max=100)
    for s in (1, 2, 3):
        c.step(SlaveJoined(s, 100), 0)
    c.step(Appended(master_max), 1)
    c.step(Waiting(needed), 1)
    for s, offset in sorted(acks.items()):
        c.step(Sent(s, master_max), 2)
        actions = c.step(Acked(s, min(offset, master_max)), 3)
        for a in actions:
            if isinstance(a, Release) and a.offset > 100 and needed > 1:
                holders = [m for m in (1, 2, 3) if c.slaves[m].ack_offset >= a.offset]
                assert len(holders) + 1 >= a.needed
    held = c.held_by_all()
    assert all(c.slaves[s].ack_offset >= held for s in (1, 2, 3)) and held <= c.master_max


# ------------------------------------------------------------- §3.5 step 4: promotion keeps what was acked


def test_3_5_4_a_promoted_slave_stops_following_before_it_leads_and_keeps_its_log():
    core = roles.RoleCore()
    old = roles.Role(True, 0, "m", "m-ha", 2, frozenset({0, 1}), 1)
    core.step(roles.Assigned(old, 2, 1), 0)
    new = roles.Role(True, 1, "s", "s-ha", 3, frozenset({0, 1}), 2)
    actions = core.step(roles.Assigned(new, 2, 1), 1)
    names = [type(a).__name__ for a in actions]
    assert names.index("StopSlave") < names.index("Promote")
    promote = next(a for a in actions if isinstance(a, roles.Promote))
    assert promote.new_epoch  # the epoch starts at its max offset: nothing it acked is cut


# ------------------------------------------------------------------ §3.5 steps 5-6: the decision


def test_3_5_5_the_rule_stands_in_for_the_lease_only_for_a_write_every_member_holds():
    lease = Lease()
    lease.renew(0, 4_000, epoch=E, unclean_elections=False)
    later = 60_000  # no controller has answered for a minute
    assert not lease.holds(later, E)
    assert lease.may_acknowledge(later, E, 500, 500, replication="sync")
    assert not lease.may_acknowledge(later, E, 501, 500, replication="sync")
    assert lease.may_start(later, E, replication="sync", needs_every_member=True)
    assert not lease.may_start(later, E, replication="sync", needs_every_member=False)


def test_3_5_6_while_the_lease_holds_nothing_changes():
    lease = Lease()
    lease.renew(0, 4_000, epoch=E, unclean_elections=True)
    assert lease.may_acknowledge(100, E, 501, 500, replication="async")
    assert lease.may_start(100, E, replication="async", needs_every_member=False)


# --------------------------------------------------------- §3.5 step 7: where the lease stays


@pytest.mark.parametrize(("unclean", "replication"), [(True, "sync"), (False, "async"), (True, "async")])
def test_3_5_7_unclean_elections_or_async_replication_keep_the_lease(unclean: bool, replication: str):
    lease = Lease()
    lease.renew(0, 4_000, epoch=E, unclean_elections=unclean)
    assert not lease.may_acknowledge(60_000, E, 500, 500, replication=replication)
    assert not lease.may_start(60_000, E, replication=replication, needs_every_member=True)


def test_3_5_7_a_broker_that_never_heard_a_controller_assumes_unclean_elections():
    lease = Lease()
    assert lease.unclean_elections
    assert not lease.may_acknowledge(1, E, 0, 0, replication="sync")


# ---------------------------------------------- the lease's grant: a leader that may be stale


def test_a_group_of_one_always_has_its_majority() -> None:
    assert majority_contact_age(10_000, [], 1) == 0.0


def test_the_majority_age_is_the_answer_that_completes_a_majority() -> None:
    # five nodes: the leader and two others make a majority; the second newest answer counts
    assert majority_contact_age(10_000, [9_900, 4_000, 9_500, 1_000], 5) == 500
    assert majority_contact_age(10_000, [9_900], 5) == float("inf")  # too few ever answered
    assert majority_contact_age(10_000, [9_000, 2_000], 3) == 1_000


@given(
    answers=st.lists(st.integers(0, 100_000), max_size=6),
    size=st.integers(1, 7),
    now=st.integers(100_000, 200_000),
)
def test_a_majority_answered_within_the_age_and_never_more_recently(answers, size, now) -> None:
    age = majority_contact_age(now, [float(a) for a in answers], size)
    need = size // 2
    recent = [a for a in answers if now - a <= age]
    assert age == 0.0 if need == 0 else len(recent) >= need or age == float("inf")


def test_3_5_a_leader_cut_off_from_its_majority_grants_no_lease_that_outlives_a_replacement() -> None:
    """The simulator's seed 46: a leader cut off at `cut` leads on for leader_fallback_timeout_ms
    and answers heartbeats. It grants only while its majority's last answer is recent, so the last
    lease it grants ends before cut + timeout, when the majority may elect another master."""
    timeout, cut = 5_000, 20_000
    last_answer = cut  # nothing answers after the cut
    granted_until = -1
    for sent in range(cut, cut + 3_000, 10):  # heartbeats during the whole fallback
        if grants_lease(majority_contact_age(sent, [last_answer, last_answer], 3), timeout):
            lease = Lease()
            lease.renew(sent, timeout, epoch=E, unclean_elections=False)
            granted_until = max(granted_until, lease.until_ms)
    assert cut < granted_until < cut + timeout


# ------------------------------------------------------- the leader's fences (controller RULES.md L7)


def test_a_fenced_master_epoch_gets_no_lease_until_every_election_of_it_settles():
    fences = LeaseFences()
    assert not fences.withholds("bs", 3)
    tick, asked = fences.hold("bs", 3), fences.hold("bs", 3)  # a controller-triggered and a requested one
    assert fences.withholds("bs", 3)
    assert not fences.withholds("bs", 4) and not fences.withholds("other", 3)  # the new master's epoch
    fences.release(tick)
    assert fences.withholds("bs", 3), "one election of the set is still in flight"
    fences.release(asked)
    assert not fences.withholds("bs", 3)
    with pytest.raises(InvariantViolation):
        fences.release(asked)


def test_a_new_term_clears_the_fences_and_a_late_settlement_of_an_older_one_is_ignored():
    fences = LeaseFences()
    old = fences.hold("bs", 3)
    fences.clear()
    assert not fences.withholds("bs", 3)
    again = fences.hold("bs", 3)
    fences.release(old)  # the older term's command settles late: it must not lift the new fence
    assert fences.withholds("bs", 3)
    fences.release(again)
    assert not fences.withholds("bs", 3)


@given(st.lists(st.tuples(st.sampled_from(["hold", "release", "clear"]), st.integers(0, 2)), max_size=40))
def test_fences_withhold_exactly_the_epochs_with_an_unsettled_election_of_this_term(steps):
    fences, live, stale = LeaseFences(), [], []
    for op, epoch in steps:
        if op == "hold":
            live.append(fences.hold("bs", epoch))
        elif op == "release" and (live or stale):
            token = (live or stale).pop()
            fences.release(token)
        elif op == "clear":
            fences.clear()
            stale.extend(live)
            live = []
        for e in range(3):
            assert fences.withholds("bs", e) == any(t[1] == e for t in live)


@pytest.mark.parametrize("timeout", [1_500, 2_500, 5_000, 10_000])
def test_a_hand_over_waits_out_the_longest_lease_on_any_two_clocks_within_the_drift_bound(timeout):
    # the master counts its lease on a clock up to DRIFT_BOUND slow, the leader waits on one up to
    # DRIFT_BOUND fast: the wait, in true time, still outlasts the lease
    longest_true = LEASE_FRACTION * timeout / (1 - DRIFT_BOUND)
    assert handover_wait_ms(timeout) / (1 + DRIFT_BOUND) > longest_true
    assert handover_wait_ms(timeout) < timeout  # and it is shorter than a failover
