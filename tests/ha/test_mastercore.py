"""The master's replication core (`ha.mastercore.MasterCore`): the rules of docs/ARCHITECTURE.md §3.1, §3.3,
§4.4 and §4.5 as scenarios, plus a state machine driving it with random event sequences and checking the
invariants after every step."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidelog.ha.ackpolicy import EVERY_MEMBER, release_need
from tidelog.ha.mastercore import (
    Acked,
    AlterFailed,
    Appended,
    ControllerState,
    Flushed,
    MasterCore,
    Propose,
    Reject,
    Release,
    Sent,
    SetConfirm,
    ShrinkCheck,
    SlaveJoined,
    SlaveLeft,
    Waiting,
)
from tidelog.ha.syncstate import Proposal
from tidelog.invariants import InvariantViolation

M = 0  # the master
SLAVES = (1, 2, 3)


def core(
    sss=frozenset({M, 1}),
    *,
    sss_epoch: int = 1,
    master_max: int = 100,
    confirm: int = 100,
    epoch_start: int = 0,
    max_not_catchup_ms: int = 1000,
) -> MasterCore:
    return MasterCore.start(
        broker_id=M,
        epoch=3,
        sync_state_set=frozenset(sss),
        sss_epoch=sss_epoch,
        master_max=master_max,
        confirm=confirm,
        epoch_start=epoch_start,
        max_not_catchup_ms=max_not_catchup_ms,
        now_ms=0,
    )


def flushing_alone() -> MasterCore:
    """A master alone in its set under flush: sync: its confirm offset follows its own fsync."""
    return MasterCore.start(
        broker_id=M,
        epoch=3,
        sync_state_set=frozenset({M}),
        sss_epoch=1,
        master_max=100,
        confirm=100,
        epoch_start=0,
        max_not_catchup_ms=1000,
        now_ms=0,
        durable=100,
    )


def snapshot(c: MasterCore) -> tuple:
    return (
        c.master_max,
        c.confirm,
        {s: vars(v).copy() for s, v in c.slaves.items()},
        set(c.needs),
        c.tracker.local,
        c.tracker.sss_epoch,
        c.tracker.pending,
        c.tracker.effective,
    )


# --- acks and the confirm offset (§3.1, §3.3, §4.4) ---------------------------------------


def test_4_4_write_acked_by_the_in_sync_slave_is_released_and_confirmed():
    c = core()
    assert c.step(SlaveJoined(1, 100), 1) == []  # holds what is confirmed: nothing moves
    assert c.step(Waiting(2), 2) == [Release(2, 100)]
    assert c.step(Appended(150), 3) == [Release(2, 100)]  # only the master holds 100..150
    assert c.confirm == 100
    assert c.step(Sent(1, 150), 4) == []  # bytes going out change no count: nothing to release
    assert c.step(Acked(1, 150), 5) == [SetConfirm(150), Release(2, 150)]
    assert c.confirm == 150


def test_4_4_ack_beyond_what_was_sent_is_rejected_and_counts_nothing():
    c = core()
    c.step(SlaveJoined(1, 100), 1)
    c.step(Waiting(2), 2)
    c.step(Appended(150), 3)
    c.step(Sent(1, 120), 4)
    before = snapshot(c)
    actions = c.step(Acked(1, 150), 5)
    assert [type(a) for a in actions] == [Reject]
    assert actions[0].slave == 1
    assert snapshot(c) == before  # no ack recorded, no confirm, no release
    assert c.slaves[1].ack_offset == 100


def test_3_3_disconnected_member_holds_the_confirm_offset_and_is_proposed_out():
    c = core()
    c.step(SlaveJoined(1, 100), 1)
    c.step(Appended(150), 2)
    c.step(Sent(1, 150), 3)
    assert c.step(SlaveLeft(1), 4) == [Propose(Proposal(frozenset({M}), 1))]
    assert c.tracker.effective == {M, 1}  # a pending shrink is not applied yet
    assert c.step(Appended(200), 5) == []
    assert c.confirm == 100  # its last ack may be stale: no advance at all
    # the controller confirms the shrink: the master alone confirms its end
    assert c.step(ControllerState(frozenset({M}), 2), 6) == [SetConfirm(200)]


def test_3_3_connected_member_holds_the_confirm_offset_at_its_ack():
    c = core(frozenset({M, 1, 2}))
    c.step(SlaveJoined(1, 100), 1)
    c.step(SlaveJoined(2, 100), 1)
    c.step(Appended(200), 2)
    c.step(Sent(1, 200), 3)
    c.step(Sent(2, 200), 3)
    assert c.step(Acked(1, 200), 4) == []  # member 2 still holds only 100
    assert c.step(Acked(2, 160), 5) == [SetConfirm(160)]
    assert c.step(Acked(2, 200), 6) == [SetConfirm(200)]


def test_3_5_pending_expansion_member_counts_from_the_proposal_and_holds_the_confirm_offset():
    """docs/ARCHITECTURE.md §3.5 step 2: an expansion counts from the moment it is proposed. A write
    sized for the effective set is released once every member of it holds the write, without
    waiting for the controller (which may be unreachable), and never by the master alone."""
    c = core(frozenset({M}))
    # caught up, at the confirm offset and past the epoch start: proposed into the set
    assert c.step(SlaveJoined(1, 100), 1) == [Propose(Proposal(frozenset({M, 1}), 1))]
    assert c.tracker.local == {M} and c.tracker.effective == {M, 1}
    assert c.step(Waiting(2), 2) == [Release(2, 100)]  # both hold 100
    assert c.step(Appended(150), 3) == [Release(2, 100)]  # not the master alone
    assert c.confirm == 100  # the confirm offset waits for the newcomer
    c.step(Sent(1, 150), 4)
    assert c.step(Acked(1, 150), 5) == [SetConfirm(150), Release(2, 150)]
    assert c.held_by_all() == 150
    # the controller confirms the expansion: nothing changes for the acks already counted
    assert c.step(ControllerState(frozenset({M, 1}), 2), 6) == [Release(2, 150)]


def test_3_5_a_write_sized_before_an_expansion_is_released_only_once_the_joining_member_holds_it():
    """The simulator's seed 7426: a master alone in its set sized a write for one ack; before its
    fsync ended it proposed a caught-up slave into the set, and the write was then acknowledged
    by the master alone. The controller applied the expansion and the new member, which lacked the
    write, could be elected. A joining member is electable once the change applies: every
    release while it is pending needs it."""
    c = flushing_alone()
    c.step(Appended(150), 1)  # sized for the master alone (one ack), its fsync still running
    assert c.acked_by(1) == 150
    assert c.step(SlaveJoined(1, 100), 2) == [Propose(Proposal(frozenset({M, 1}), 1))]
    assert c.acked_by(1) == 100  # now the joining member must hold it too
    assert c.step(Waiting(1), 3) == [Release(1, 100)]
    c.step(Sent(1, 150), 4)
    assert Release(1, 150) in c.step(Acked(1, 150), 5)
    # the controller refuses the expansion: the master alone releases its end again
    c.step(Appended(180), 6)
    c.step(AlterFailed(c.tracker.pending, 1), 7)
    assert c.tracker.pending is None and c.acked_by(1) == 180


def test_3_1_a_write_that_needs_the_whole_set_needs_a_member_added_after_it_was_sized():
    """The simulator's seed 5374: sized for both members of [M, 1], released after the set grew
    to [M, 1, 2] on the acks of M and 2 while 1, which lacked it, was still electable."""
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    need = release_need(2, 2)
    assert need == EVERY_MEMBER
    c.step(Waiting(need), 2)
    c.step(Appended(150), 3)
    c.step(ControllerState(frozenset({M, 1, 2}), 2), 4)  # 2 joined; the controller applied it
    c.step(SlaveJoined(2, 150), 5)
    assert c.acked_by(2) == 150  # a count of two would release it now
    assert c.acked_by(need) == 100  # member 1 still holds only 100
    c.step(Sent(1, 150), 6)
    assert Release(need, 150) in c.step(Acked(1, 150), 7)


def test_3_5_a_pending_member_never_stands_in_for_a_confirmed_one():
    """An ack from a member of a pending expansion releases nothing while a confirmed member lacks
    the write: if the expansion is never applied, the confirmed member may be elected."""
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    assert c.step(SlaveJoined(2, 100), 1) == [Propose(Proposal(frozenset({M, 1, 2}), 1))]
    c.step(Waiting(2), 2)
    c.step(Appended(200), 3)
    c.step(Sent(2, 200), 4)
    assert c.step(Acked(2, 200), 5) == [Release(2, 100)]  # member 1 still holds only 100
    assert c.held_by_all() == 100


def test_3_1_ack_of_a_slave_outside_the_set_counts_nowhere():
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    c.step(SlaveJoined(2, 50), 1)  # behind the confirm offset: not proposed
    assert c.tracker.pending is None
    assert c.step(Waiting(2), 2) == [Release(2, 100)]
    c.step(Appended(150), 3)
    c.step(Sent(1, 150), 4)
    c.step(Sent(2, 150), 4)
    # slave 2 holds 150 and is proposed, but only member 1 (at 100) votes
    assert c.step(Acked(2, 150), 5) == [Propose(Proposal(frozenset({M, 1, 2}), 1)), Release(2, 100)]
    assert c.step(ControllerState(frozenset({M, 1, 2}), 2), 6) == [Release(2, 150)]
    assert c.confirm == 100  # member 1 still holds only 100


def test_4_4_new_member_is_proposed_only_past_the_epoch_start():
    c = core(frozenset({M, 1}), master_max=100, confirm=50, epoch_start=90)
    assert c.step(SlaveJoined(1, 60), 1) == [SetConfirm(60)]
    assert c.step(SlaveJoined(2, 85), 1) == []  # past the confirm offset, not this epoch's start
    c.step(Sent(2, 100), 2)
    assert c.step(Acked(2, 100), 3) == [Propose(Proposal(frozenset({M, 1, 2}), 1))]


# --- SyncStateSet upkeep (§4.5) -----------------------------------------------------------


def _with_newer_proposal() -> tuple[MasterCore, Proposal, Proposal]:
    """A shrink proposed at set epoch 1, overtaken by the controller's set of epoch 2, then an expansion.

    The story: slave 1 disconnects and the master proposes dropping it while an operator cleans broker 1
    from the broker set (controller/membership.py, a new set epoch). The controller refuses the master's
    proposal (its set epoch is no longer current), but the master may learn the new set first and, when
    slave 2 joins caught up, propose expanding to it."""
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    [old] = c.step(SlaveLeft(1), 2)
    assert isinstance(old, Propose)
    c.step(ControllerState(frozenset({M}), 2), 3)
    assert c.tracker.pending is None
    assert c.step(SlaveJoined(2, 100), 4) == [Propose(Proposal(frozenset({M, 2}), 2))]
    return c, old.proposal, c.tracker.pending


def test_4_5_unknown_outcome_of_an_overtaken_proposal_is_ignored():
    c, old, new = _with_newer_proposal()
    assert c.step(AlterFailed(old, 1), 5) == []
    assert c.tracker.pending == new
    assert c.tracker.effective == {M, 2}  # the newer proposal still holds the confirm offset
    assert c.step(Appended(150), 6) == []
    assert c.confirm == 100


def test_4_5_unknown_outcome_of_the_pending_proposal_gives_it_up():
    c, _old, new = _with_newer_proposal()
    c.step(AlterFailed(new, 2), 5)
    assert c.tracker.pending is None
    assert c.tracker.effective == {M}
    assert c.step(Appended(150), 6) == [SetConfirm(150)]


def test_4_5_unknown_outcome_after_a_newer_set_of_the_same_proposal_is_ignored():
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    [p] = c.step(SlaveLeft(1), 2)
    c.step(ControllerState(frozenset({M, 1, 2}), 2), 3)  # some newer set, the leaving member still in it
    before = snapshot(c)
    assert c.step(AlterFailed(p.proposal, 1), 4) == []
    assert snapshot(c) == before


def test_4_5_refusal_ends_the_pending_proposal():
    c = core(frozenset({M, 1}))
    c.step(SlaveJoined(1, 100), 1)
    [p] = c.step(SlaveLeft(1), 2)
    c.step(AlterFailed(p.proposal, 1), 3)
    assert c.tracker.pending is None
    assert c.step(ShrinkCheck(), 4) == [p]  # the next check proposes again


def test_4_5_late_refusal_of_an_overtaken_proposal_keeps_the_newer_one():
    c, old, new = _with_newer_proposal()
    c.step(AlterFailed(old, 1), 5)  # the refusal of the overtaken shrink comes in late
    assert c.tracker.pending == new  # the expansion is still in flight: the controller may apply it
    c.step(Appended(150), 6)
    assert c.confirm == 100  # slave 2 may be in the set already and holds only 100


def test_4_5_stale_member_is_proposed_out_after_the_grace():
    c = core(frozenset({M, 1}), max_not_catchup_ms=1000)
    c.step(SlaveJoined(1, 100), 10)
    c.step(Appended(200), 20)
    c.step(Sent(1, 200), 20)
    c.step(Acked(1, 150), 30)  # lagging behind what was sent
    assert c.step(ShrinkCheck(), 900) == []
    assert c.step(ShrinkCheck(), 1100) == [Propose(Proposal(frozenset({M}), 1))]


# --- invariants ---------------------------------------------------------------------------


def test_5_1_log_going_back_is_an_invariant_violation():
    c = core()
    with pytest.raises(InvariantViolation, match="went back"):
        c.step(Appended(99), 1)


def test_5_1_master_outside_its_sync_state_set_is_an_invariant_violation():
    with pytest.raises(InvariantViolation, match="not in its SyncStateSet"):
        core(frozenset({1, 2}))


def test_5_1_confirm_beyond_the_max_is_an_invariant_violation():
    with pytest.raises(InvariantViolation, match="passes max"):
        core(master_max=100, confirm=101)


def test_5_1_check_catches_an_ack_counted_beyond_what_was_sent():
    c = core()
    c.step(SlaveJoined(1, 100), 1)
    c.slaves[1].ack_offset = 101  # what a missing sent_end check would leave behind
    with pytest.raises(InvariantViolation, match="beyond"):
        c.check()


# --- property: random event sequences -----------------------------------------------------


def upto(high: int, low: int = 0) -> st.SearchStrategy[int]:
    """An offset in [low, high], often `high` itself (caught-up slaves are where the rules bite)."""
    high = max(low, high)
    return st.one_of(st.just(high), st.integers(low, high))


class MasterMachine(RuleBasedStateMachine):
    """Drives one MasterCore with random events and checks the invariants after every step."""

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        others = data.draw(st.frozensets(st.sampled_from(SLAVES)), label="slaves in the set")
        master_max = data.draw(st.integers(0, 500), label="master_max")
        confirm = data.draw(st.integers(0, master_max), label="confirm")
        epoch_start = data.draw(st.integers(0, master_max), label="epoch_start")
        self.now = 0
        self.core = core(
            others | {M},
            sss_epoch=data.draw(st.integers(0, 3)),
            master_max=master_max,
            confirm=confirm,
            epoch_start=epoch_start,
            max_not_catchup_ms=300,
        )
        self.confirm = confirm

    def drive(self, event, dt: int = 0) -> list:
        c = self.core
        self.now += dt
        before = snapshot(c)
        actions = c.step(event, self.now)
        # confirm only grows, never past the master's end; SetConfirm says where it went
        assert c.confirm >= self.confirm
        assert c.confirm <= c.master_max
        moves = [a.offset for a in actions if isinstance(a, SetConfirm)]
        assert moves == ([c.confirm] if c.confirm != self.confirm else [])
        if moves:
            # §3.3: every other member of the effective set is connected and holds the new confirm offset
            for member in c.tracker.effective - {M}:
                assert member in c.slaves and c.slaves[member].ack_offset >= c.confirm
        self.confirm = c.confirm
        assert M in c.tracker.local and M in c.tracker.effective
        for view in c.slaves.values():
            assert view.ack_offset <= view.sent_end
        held = {M: c.master_max} | {s: min(a, c.master_max) for s, a in c.acks().items()}
        for action in actions:
            if isinstance(action, Release):
                assert action.offset <= c.master_max
                assert action.needed in c.needs
                if action.needed > 1 and action.offset > 0:
                    # §3.1: `needed` members of the confirmed set hold it, or (§3.5) every
                    # member of the effective set does, and there are at least `needed` of them
                    holders = [m for m in c.tracker.local if held.get(m, 0) >= action.offset]
                    everyone = all(held.get(m, -1) >= action.offset for m in c.tracker.effective)
                    assert len(holders) >= action.needed or (
                        everyone and len(c.tracker.effective) >= action.needed
                    )
            if isinstance(action, Propose):
                assert M in action.proposal.new_sync_state_set
        if any(isinstance(a, Reject) for a in actions):
            assert [type(a) for a in actions] == [Reject]
            assert snapshot(c) == before
        c.check()
        return actions

    @rule(grow=st.integers(0, 100), dt=st.integers(0, 50))
    def append(self, grow: int, dt: int) -> None:
        self.drive(Appended(self.core.master_max + grow), dt)

    @rule(slave=st.sampled_from(SLAVES), data=st.data())
    def join(self, slave: int, data: st.DataObject) -> None:
        start = data.draw(upto(self.core.master_max), label="start")
        self.drive(SlaveJoined(slave, start), data.draw(st.integers(0, 50), label="dt"))

    @precondition(lambda self: self.core.slaves)
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        slave = data.draw(st.sampled_from(sorted(self.core.slaves)), label="slave")
        view = self.core.slaves[slave]
        end = data.draw(upto(self.core.master_max, low=view.sent_end), label="end")
        self.drive(Sent(slave, end), data.draw(st.integers(0, 50), label="dt"))

    @precondition(lambda self: self.core.slaves)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        slave = data.draw(st.sampled_from(sorted(self.core.slaves)), label="slave")
        sent_end = self.core.slaves[slave].sent_end
        offset = data.draw(upto(sent_end), label="offset")
        actions = self.drive(Acked(slave, offset), data.draw(st.integers(0, 50), label="dt"))
        assert not any(isinstance(a, Reject) for a in actions)

    @precondition(lambda self: self.core.slaves)
    @rule(data=st.data(), beyond=st.integers(1, 100))
    def ack_beyond_what_was_sent(self, data: st.DataObject, beyond: int) -> None:
        slave = data.draw(st.sampled_from(sorted(self.core.slaves)), label="slave")
        actions = self.drive(Acked(slave, self.core.slaves[slave].sent_end + beyond))
        assert [type(a) for a in actions] == [Reject]

    @rule(slave=st.sampled_from(SLAVES))
    def ack_from_a_stranger(self, slave: int) -> None:
        if slave not in self.core.slaves:
            self.drive(Acked(slave, self.core.master_max))  # an ack racing its connection's end

    @rule(slave=st.sampled_from(SLAVES), dt=st.integers(0, 50))
    def leave(self, slave: int, dt: int) -> None:
        self.drive(SlaveLeft(slave), dt)

    @rule(others=st.frozensets(st.sampled_from(SLAVES)), newer=st.integers(1, 2), dt=st.integers(0, 50))
    def controller_state(self, others: frozenset[int], newer: int, dt: int) -> None:
        self.drive(ControllerState(others | {M}, self.core.tracker.sss_epoch + newer), dt)

    @rule(others=st.frozensets(st.sampled_from(SLAVES)), older=st.integers(0, 2))
    def stale_controller_state(self, others: frozenset[int], older: int) -> None:
        self.drive(ControllerState(others | {M}, self.core.tracker.sss_epoch - older))

    @precondition(lambda self: self.core.tracker.pending is not None)
    @rule(dt=st.integers(0, 50))
    def alter_failed(self, dt: int) -> None:
        self.drive(AlterFailed(self.core.tracker.pending, self.core.tracker.sss_epoch), dt)

    @rule(needed=st.integers(1, 4))
    def waiting(self, needed: int) -> None:
        self.drive(Waiting(needed))

    @rule(dt=st.integers(0, 400))
    def shrink_check(self, dt: int) -> None:
        self.drive(ShrinkCheck(), dt)

    @invariant()
    def core_checks_hold(self) -> None:
        self.core.check()


TestMasterMachine = MasterMachine.TestCase
TestMasterMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_3_3_under_flush_sync_the_master_counts_only_what_it_flushed() -> None:
    """A master alone in its set used to confirm a record at its append, before its fsync: a
    reader could see what a crash then took back (the simulator's seed 1)."""
    c = flushing_alone()
    assert c.step(Appended(150), 1) == []  # appended, not on disk: not confirmed
    assert c.confirm == 100
    assert c.step(Flushed(150), 2) == [SetConfirm(150)]
    # without `durable` (flush: async) the end counts at once, as before
    plain = core(frozenset({M}))
    assert plain.step(Appended(150), 1) == [SetConfirm(150)]
