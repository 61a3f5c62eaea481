"""Fencing, recovery and the writer's add rules: the pure core against the reference.

Every test is named after the section (and step, hazard or case) of the reference
`bookkeeper-ledger.md` it checks; rule numbers are ledger/RULES.md's. The reference has no
numbered scenario list for recovery, so its sections, steps and hazards are the scenarios.

Scenarios that apply when E = WQ, all covered here:
  §2.3 quorum coverage with a single window — fencing done at (E − AQ) + 1 fenced answers, for
       every E ≤ 5 and AQ ≤ E, plus the TLA+ QuorumCoverage equivalences (exhaustively);
       an Unauthorized answer fails at once.
  §2.4 recovery steps 0–8 — CLOSED does nothing; CAS before fence; already IN_RECOVERY joins;
       CLOSED at CAS time adopts; start at max LAC + 1 with the ensemble floor (defect 2); reads
       fence; rewrites need AQ confirmations before the close; stop at the first negative and
       ignore entries after a gap; close by CAS, adopt another closer; error mapping;
       concurrent recoveries converge.
  §2.5 per-entry decision — positive on the first copy, negative at (WQ − AQ) + 1 no-such-entry
       (no-such-ledger counts), unknown aborts ("unknown aborts" cases).
  §2.6 the writer after fencing — pending adds LedgerFenced, later adds LedgerClosed; an add
       with AQ acks before the fence stands; with E = WQ no add reaches AQ after fencing.
  §2.2 LAC advances in order over AQ-confirmed entries; §2.7 writer close fails pending adds.
  §2.9 hazards 1 (reads fence), 2 (floor), 3 (ensemble snapshot, no ensemble change during
       recovery), 4 (unknown is never negative), 5 (lost data answers ERROR and aborts).
  §2.10 TLA+ invariants as properties: no close below an acknowledged entry
       (NoDivergenceBetweenClientAndMetaData), recovered entries keep their payload
       (NoOutOfOrderEntries), every entry up to the close sits on ≥ AQ replicas of those that
       answered (AllCommittedEntriesReachAckQuorum, for the entries recovery rewrote).

Scenarios that do not apply, and why:
  §2.3 E > WQ examples (E6/WQ2/AQ2, E5/WQ3/AQ2) and the per-window rule: tidelog has E = WQ
       (one window), and the trackers refuse E ≠ WQ (tested).
  §2.2 striping (write set (e + i) mod E) and ensemble changes on write errors, §2.4 step 4's
       local replacement of a failed write-back replica: the ensemble is the broker set; there
       is no spare replica to swap in, so a rewrite that cannot reach AQ aborts instead.
  §2.4 step 3 speculative reads and replica order inside one entry's read: I/O shell timing;
       the decision depends only on the set of answers.
  §2.4 step 0 password/digest checks and step 7's ClientClosed: done by the shell before and
       around the core (`LedgerMetadata.check_password`). Step 7's Timeout (−23) passthrough: the
       issue asks for LedgerRecoveryError for timeouts too (RULES.md D3).
  §1.3 CLOSED → IN_RECOVERY (forceRecovery): not offered, CLOSED is final (test_metadata.py).
  §2.7 BookKeeper's code letting a writer's close override IN_RECOVERY: we follow protocol.md
       and TLA+ instead (test_metadata.py, RULES.md D1).
  §2.9 hazard 6 (re-replicating an open fragment), 7 (fencing the last two ledgers of a log),
       8 (reads beyond LAC): outside one ledger's recovery. §2.8 tailing readers and §2.10's
       limbo state (DataUnknown −108): tidelog replicas answer ERROR for unknown data, which the
       core already treats as unknown.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tidelog.ledger import (
    CloseLedger,
    EntryDecision,
    EntryRecoveryTracker,
    FenceOutcome,
    FenceTracker,
    LedgerClosedError,
    LedgerFencedError,
    LedgerMetadata,
    LedgerRecoveryError,
    LedgerState,
    MarkInRecovery,
    ReadEntry,
    ReadOutcome,
    Recovery,
    RecoveryProtocolError,
    RecoveryState,
    RewriteEntry,
    SendFence,
    UnauthorizedAccessError,
    WriterLedger,
    advance_lac,
    fencing_quorum,
    hash_password,
    negative_quorum,
)

F, FE, FT, FU = FenceOutcome.FENCED, FenceOutcome.ERROR, FenceOutcome.TIMEOUT, FenceOutcome.UNAUTHORIZED
P, NSE, NSL, ERR, TMO, UNA = (
    ReadOutcome.PRESENT,
    ReadOutcome.NO_SUCH_ENTRY,
    ReadOutcome.NO_SUCH_LEDGER,
    ReadOutcome.ERROR,
    ReadOutcome.TIMEOUT,
    ReadOutcome.UNAUTHORIZED,
)
RECOVERABLE, UNRECOVERABLE, ABORT, PENDING = (
    EntryDecision.RECOVERABLE,
    EntryDecision.UNRECOVERABLE,
    EntryDecision.ABORT,
    EntryDecision.PENDING,
)


def payload(i: int) -> bytes:
    return f"entry-{i}".encode()


def cumulative(i: int) -> int:
    return sum(len(payload(j)) for j in range(i + 1))


def ledger(
    e: int = 3,
    aq: int = 2,
    state: LedgerState = LedgerState.OPEN,
    *,
    ensembles=None,
    last: int = -1,
    length: int = 0,
    version: int = 1,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=1,
        broker_set="broker-a",
        ensemble_size=e,
        write_quorum=e,
        ack_quorum=aq,
        ensembles=ensembles or ((0, tuple(range(1, e + 1))),),
        password_hash=hash_password(b"pw"),
        state=state,
        last_entry_id=last,
        length=length,
        version=version,
    )


# --- §2.3 quorum coverage, E = WQ -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "e", "aq", "answers", "fenced", "failed"),
    [
        ("§2.3 E3/AQ2: two fenced of three suffice", 3, 2, [F, F], True, False),
        ("§2.3 E3/AQ2: one fenced is not enough", 3, 2, [F], False, False),
        ("§2.3 E3/AQ2: a timeout and two fenced", 3, 2, [FT, F, F], True, False),
        ("§2.3 E3/AQ2: two timeouts leave AQ unfenced — fails", 3, 2, [FT, F, FT], False, True),
        ("§2.3 E3/AQ2: an error and a timeout fail", 3, 2, [FE, FT], False, True),
        ("§2.3 E3/AQ3: one fenced suffices", 3, 3, [F], True, False),
        ("§2.3 E3/AQ3: two errors do not fail yet", 3, 3, [FE, FE], False, False),
        ("§2.3 E3/AQ3: three errors fail", 3, 3, [FE, FE, FE], False, True),
        ("§2.3 E3/AQ1: every replica must be fenced", 3, 1, [F, F], False, False),
        ("§2.3 E3/AQ1: all three fenced", 3, 1, [F, F, F], True, False),
        ("§2.3 E3/AQ1: one timeout fails", 3, 1, [F, FT], False, True),
        ("§2.3 E2/AQ2: one fenced suffices (two-datacenter default)", 2, 2, [F], True, False),
        ("§2.3 E2/AQ2: both down fails", 2, 2, [FT, FT], False, True),
        ("§2.3 E2/AQ1: both must be fenced", 2, 1, [F], False, False),
        ("§2.3 E2/AQ1: one down fails", 2, 1, [FT], False, True),
        ("§2.3 E1/AQ1: the single replica", 1, 1, [F], True, False),
        ("§2.3 E5/AQ3: three fenced", 5, 3, [F, FT, F, F], True, False),
        ("§2.3 E5/AQ3: three down fails", 5, 3, [FT, F, FE, FT], False, True),
        ("§2.3 Unauthorized fails at once", 3, 2, [FU], False, True),
        ("§2.3 Unauthorized after fencing is a straggler", 3, 2, [F, F, FU], True, False),
    ],
)
def test_fence_coverage_table(name, e, aq, answers, fenced, failed):
    tracker = FenceTracker(range(1, e + 1), aq)
    for replica, outcome in zip(range(1, e + 1), answers, strict=False):
        tracker.on_response(replica, outcome, lac=replica)
    assert (tracker.fenced, tracker.failed) == (fenced, failed)
    if failed:
        expected = UnauthorizedAccessError if FU in answers else LedgerRecoveryError
        assert isinstance(tracker.error, expected)


def test_fence_max_lac_is_the_largest_reported_with_its_length():
    tracker = FenceTracker([1, 2, 3], 2)
    tracker.on_response(2, F, lac=5, length=50)
    tracker.on_response(1, F, lac=3, length=30)
    assert tracker.fenced and (tracker.max_lac, tracker.length_at_max_lac) == (5, 50)


@pytest.mark.parametrize("e", [1, 2, 3, 4, 5])
def test_quorum_coverage_tla_equivalences(e):
    # QuorumCoverage*.tla: for cohort = ensemble (E = WQ) these are the same predicate:
    #   (cohort − AQ) + 1 satisfy; every AQ-subset has one that satisfies; fewer than AQ do not
    #   satisfy; no AQ-subset consists only of ones that do not satisfy
    cohort = range(e)
    for aq in range(1, e + 1):
        for k in range(e + 1):
            for satisfied in map(set, itertools.combinations(cohort, k)):
                a = len(satisfied) >= fencing_quorum(e, aq)
                b = all(set(s) & satisfied for s in itertools.combinations(cohort, aq))
                c = e - len(satisfied) < aq
                d = not any(not (set(s) & satisfied) for s in itertools.combinations(cohort, aq))
                assert a == b == c == d
                assert negative_quorum(e, aq) == fencing_quorum(e, aq)  # one window: same figure


# --- §2.5 one entry's recovery read ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "e", "aq", "answers", "expected"),
    [
        ("§2.5 positive on the first copy", 3, 2, [P], RECOVERABLE),
        ("§2.5 positive after errors", 3, 2, [TMO, ERR, P], RECOVERABLE),
        ("§2.5 positive after one no-such-entry", 3, 2, [NSE, P], RECOVERABLE),
        ("§2.5 E3/AQ2 negative at (WQ − AQ) + 1 = 2 no-such-entry", 3, 2, [NSE, NSE], UNRECOVERABLE),
        ("§2.5 E3/AQ2 no-such-ledger counts as negative", 3, 2, [NSL, NSE], UNRECOVERABLE),
        ("§2.5 E3/AQ2 negative with a timeout among them", 3, 2, [NSE, TMO, NSE], UNRECOVERABLE),
        ("§2.5 E3/AQ2 one no-such-entry is pending", 3, 2, [NSE], PENDING),
        ("§2.5 E3/AQ3 one no-such-entry is negative", 3, 3, [NSE], UNRECOVERABLE),
        ("§2.5 E3/AQ1 needs all three no-such-entry", 3, 1, [NSE, NSE], PENDING),
        ("§2.5 E3/AQ1 three no-such-entry", 3, 1, [NSE, NSE, NSE], UNRECOVERABLE),
        ("§2.5 E2/AQ2 one no-such-entry", 2, 2, [NSE], UNRECOVERABLE),
        ("§2.5 E2/AQ1 both no-such-entry", 2, 1, [NSE, NSE], UNRECOVERABLE),
        ("§2.5 first decisive answer wins (negative first)", 3, 2, [NSE, NSE, P], UNRECOVERABLE),
        ("§2.5 first decisive answer wins (positive first)", 3, 2, [P, NSE, NSE], RECOVERABLE),
        # unknown aborts
        ("§2.5/§2.9-4 unknown: one negative, two timeouts", 3, 2, [NSE, TMO, TMO], ABORT),
        ("§2.5/§2.9-4 unknown: one negative, an error and a timeout", 3, 2, [NSE, ERR, TMO], ABORT),
        ("§2.5/§2.9-4 unknown: all timeouts", 3, 2, [TMO, TMO, TMO], ABORT),
        ("§2.5/§2.9-5 unknown: lost data answers error", 3, 2, [ERR, NSE, ERR], ABORT),
        ("§2.5 unknown: E3/AQ1 two negatives and an error", 3, 1, [NSE, NSE, ERR], ABORT),
        ("§2.5 unknown: E2/AQ1 a negative and a timeout", 2, 1, [NSE, TMO], ABORT),
        ("§2.5 no early abort while a replica may still hold it", 3, 2, [TMO, TMO], PENDING),
        ("§2.4-7 Unauthorized aborts at once", 3, 2, [UNA], ABORT),
    ],
)
def test_entry_decision_table(name, e, aq, answers, expected):
    tracker = EntryRecoveryTracker(4, range(1, e + 1), e, aq)
    for replica, outcome in zip(range(1, e + 1), answers, strict=False):
        tracker.on_response(replica, outcome, payload(4) if outcome is P else None)
    assert tracker.decision is expected
    if expected is RECOVERABLE:
        assert tracker.payload == payload(4)
    if expected is ABORT:
        err = tracker.error
        assert isinstance(err, UnauthorizedAccessError if UNA in answers else LedgerRecoveryError)
        assert err.retryable == (UNA not in answers)
        assert err.number == (-102 if UNA in answers else -10)


def test_trackers_refuse_e_other_than_wq_and_protocol_slips():
    with pytest.raises(RecoveryProtocolError):
        EntryRecoveryTracker(0, [1, 2, 3], 2, 2)  # §2.3 E > WQ is not tidelog's
    tracker = EntryRecoveryTracker(0, [1, 2, 3], 3, 2)
    with pytest.raises(RecoveryProtocolError):
        tracker.on_response(9, NSE)  # not a replica of the set
    tracker.on_response(1, NSE)
    with pytest.raises(RecoveryProtocolError):
        tracker.on_response(1, NSE)  # one replica, one answer
    with pytest.raises(RecoveryProtocolError):
        tracker.on_response(2, P)  # a copy carries its payload


# --- a simulated broker set to drive the whole recovery -----------------------------------------


@dataclass
class Replica:
    held: dict[int, int] = field(default_factory=dict)  # entry → the writer's LAC piggybacked on it
    lost: set[int] = field(default_factory=set)  # held once, now unreadable: answers ERROR
    fence: FenceOutcome = F
    reads: dict[int, ReadOutcome] = field(default_factory=dict)  # entry → forced answer (timeouts, errors)
    rewrite_ok: bool = True
    fenced: bool = False

    def fence_answer(self) -> tuple[FenceOutcome, int, int]:
        known = [lac for e, lac in self.held.items() if e not in self.lost]
        lac = max(known, default=-1)
        return self.fence, lac, cumulative(lac) if lac >= 0 else 0

    def read_answer(self, entry: int) -> ReadOutcome:
        if entry in self.reads:
            return self.reads[entry]
        if entry in self.lost:
            return ERR
        return P if entry in self.held else NSE


class Cluster:
    """Replicas plus the controller's metadata CAS; runs a recovery to its end."""

    def __init__(self, meta: LedgerMetadata, replicas: dict[int, Replica]) -> None:
        self.meta = meta
        self.replicas = replicas
        self.rewritten: dict[int, bytes] = {}
        self.held_at_close: dict[int, int] = {}
        self.actions: list = []

    def cas(self, expected_version: int, new: LedgerMetadata) -> LedgerMetadata:
        if self.meta.version == expected_version:
            self.meta = replace(new, version=expected_version + 1)
        return self.meta

    def deliveries(self, rec: Recovery, action) -> list:
        self.actions.append(action)
        out = []
        if isinstance(action, MarkInRecovery):
            new = (
                replace(self.meta, state=LedgerState.IN_RECOVERY)
                if self.meta.state is LedgerState.OPEN
                else self.meta
            )
            out.append(lambda: rec.on_metadata(self.cas(action.expected_version, new)))
        elif isinstance(action, CloseLedger):
            # what the replicas hold when the close is asked for: the AQ check must hold *then*,
            # not only after stragglers arrive
            self.held_at_close = {
                e: sum(1 for rep in self.replicas.values() if e in rep.held and e not in rep.lost)
                for e in self.rewritten
            }
            new = self.meta
            if self.meta.state is LedgerState.IN_RECOVERY:
                new = replace(
                    self.meta,
                    state=LedgerState.CLOSED,
                    last_entry_id=action.last_entry_id,
                    length=action.length,
                )
            out.append(lambda: rec.on_metadata(self.cas(action.expected_version, new)))
        elif isinstance(action, SendFence):
            for r in action.replicas:

                def fence(r=r):
                    self.replicas[r].fenced = True
                    return rec.on_fence_response(r, *self.replicas[r].fence_answer())

                out.append(fence)
        elif isinstance(action, ReadEntry):
            assert action.fence  # §2.9 hazard 1: every recovery read fences
            for r in action.replicas:

                def read(r=r, e=action.entry_id):
                    self.replicas[r].fenced = True
                    outcome = self.replicas[r].read_answer(e)
                    if outcome is P:  # a stored entry carries the cumulative length in its header
                        return rec.on_read_response(e, r, outcome, payload(e), cumulative(e))
                    return rec.on_read_response(e, r, outcome)

                out.append(read)
        elif isinstance(action, RewriteEntry):
            self.rewritten[action.entry_id] = action.payload
            for r in action.replicas:

                def rewrite(r=r, e=action.entry_id):
                    ok = self.replicas[r].rewrite_ok
                    if ok:
                        self.replicas[r].held.setdefault(e, e - 1)
                        self.replicas[r].lost.discard(e)
                    return rec.on_rewrite_response(e, r, ok)

                out.append(rewrite)
        else:  # pragma: no cover - a new action type must be handled here
            raise AssertionError(action)
        return out

    def run(self, rec: Recovery, rng: random.Random | None = None, first=None) -> Recovery:
        queue = [d for a in (first if first is not None else rec.start()) for d in self.deliveries(rec, a)]
        while queue:
            i = rng.randrange(len(queue)) if rng else 0
            for a in queue.pop(i)():
                queue.extend(self.deliveries(rec, a))
        return rec


def written(n: int, holders: list[list[int]], lacs: list[int] | None = None) -> dict[int, Replica]:
    """Replicas 1..n; entry i held by holders[i], piggybacking lacs[i] (default i − 1)."""
    reps = {r: Replica() for r in range(1, n + 1)}
    for i, hs in enumerate(holders):
        for r in hs:
            reps[r].held[i] = lacs[i] if lacs else i - 1
    return reps


# --- §2.4 the whole recovery, step by step -------------------------------------------------------


def test_s2_4_step0_closed_ledger_does_nothing_and_fences_nothing():
    meta = ledger(state=LedgerState.CLOSED, last=4, length=40)
    rec = Recovery(meta)
    assert rec.start() == []
    assert rec.state is RecoveryState.DONE and rec.fence is None
    assert (rec.result.last_entry_id, rec.result.length, rec.result.our_end) == (4, 40, None)
    with pytest.raises(RecoveryProtocolError):
        rec.on_fence_response(1, F)  # nothing was fenced, so no answer can come


def test_s2_4_step1_cas_before_any_fence():
    rec = Recovery(ledger(version=7))
    assert rec.start() == [MarkInRecovery(1, 7)]
    assert rec.state is RecoveryState.MARKING
    with pytest.raises(RecoveryProtocolError):
        rec.on_fence_response(1, F)  # fences go out only after the IN_RECOVERY write succeeded
    acts = rec.on_metadata(ledger(state=LedgerState.IN_RECOVERY, version=8))
    assert acts == [SendFence(1, (1, 2, 3))]


def test_s2_4_step1_cas_lost_to_another_change_is_retried_on_the_new_version():
    rec = Recovery(ledger(version=7))
    rec.start()
    assert rec.on_metadata(ledger(version=9)) == [MarkInRecovery(1, 9)]


def test_s2_4_step1_already_in_recovery_joins_without_cas():
    rec = Recovery(ledger(state=LedgerState.IN_RECOVERY))
    assert rec.start() == [SendFence(1, (1, 2, 3))]


def test_s2_4_step1_closed_at_cas_time_adopts_and_does_not_fence():
    rec = Recovery(ledger())
    rec.start()
    assert rec.on_metadata(ledger(state=LedgerState.CLOSED, last=2, length=20)) == []
    assert rec.state is RecoveryState.DONE and rec.fence is None and rec.result.last_entry_id == 2


def test_s2_4_step2_reading_starts_after_the_largest_lac_of_the_fenced():
    cluster = Cluster(ledger(), written(3, [[1, 2, 3]] * 6, lacs=[-1, 0, 1, 2, 3, 3]))
    cluster.replicas[3].held = {i: lac for i, lac in cluster.replicas[3].held.items() if i <= 2}
    rec = cluster.run(Recovery(cluster.meta))
    assert rec.start_lac == 3  # replicas 1 and 2 answered first with LAC 3 (entries up to 5)
    reads = [a.entry_id for a in cluster.actions if isinstance(a, ReadEntry)]
    assert reads == [4, 5, 6]
    assert rec.result.last_entry_id == 5 and rec.result.length == cumulative(5)


def test_s2_4_step2_defect2_floor_at_the_last_ensemble():
    # the last ensemble starts at 10: entries below it are sealed in earlier ensembles and
    # reading must not start in them even if the replicas report an older LAC
    meta = ledger(state=LedgerState.IN_RECOVERY, ensembles=((0, (1, 2, 4)), (10, (1, 2, 3))))
    cluster = Cluster(meta, written(4, [[1, 2, 3]] * 11, lacs=[-1] * 11))
    rec = cluster.run(Recovery(meta))
    assert rec.start_lac == 9
    assert [a.entry_id for a in cluster.actions if isinstance(a, ReadEntry)] == [10, 11]
    # §2.9 hazard 3: fences and reads go to the last ensemble only, and no ensemble is written
    assert all(a.replicas == (1, 2, 3) for a in cluster.actions if isinstance(a, (SendFence, ReadEntry)))
    assert cluster.meta.ensembles == meta.ensembles


def test_s2_4_step2_defect2_length_at_the_floor_is_never_made_up():
    # nothing was written in the last ensemble: the end is its floor, whose length only the
    # caller can know (an open ledger's metadata has no length)
    meta = ledger(state=LedgerState.IN_RECOVERY, ensembles=((0, (1, 2, 4)), (10, (1, 2, 3))))
    rec = Cluster(meta, written(4, [[1, 2, 3]] * 10, lacs=[-1] * 10)).run(Recovery(meta))
    assert rec.state is RecoveryState.ABORTED and isinstance(rec.error, LedgerRecoveryError)
    cluster = Cluster(meta, written(4, [[1, 2, 3]] * 10, lacs=[-1] * 10))
    rec = cluster.run(Recovery(meta, floor_length=cumulative(9)))
    assert (rec.result.last_entry_id, rec.result.length) == (9, cumulative(9))


def test_s2_4_step4_close_waits_for_aq_rewrite_confirmations():
    rec = Recovery(ledger(state=LedgerState.IN_RECOVERY))
    rec.start()
    for r in (1, 2):
        rec.on_fence_response(r, F, lac=-1)
    acts = rec.on_read_response(0, 1, P, payload(0))
    assert RewriteEntry(1, 0, payload(0), cumulative(0), (1, 2, 3)) in acts
    assert ReadEntry(1, 1, (1, 2, 3)) in acts
    rec.on_read_response(1, 1, NSE)
    assert rec.on_read_response(1, 2, NSE) == []  # entry 1 is negative, but entry 0's rewrite is not safe yet
    assert rec.state is RecoveryState.DRAINING
    assert rec.on_rewrite_response(0, 3, True) == []
    assert rec.on_rewrite_response(0, 1, True) == [CloseLedger(1, 0, cumulative(0), 1)]


def test_s2_4_step4_rewrite_that_cannot_reach_aq_aborts():
    reps = written(3, [[1]])
    reps[2].rewrite_ok = reps[3].rewrite_ok = False
    cluster = Cluster(ledger(), reps)
    rec = cluster.run(Recovery(cluster.meta))
    assert rec.state is RecoveryState.ABORTED and isinstance(rec.error, LedgerRecoveryError)
    assert cluster.meta.state is LedgerState.IN_RECOVERY  # nothing was closed


def test_s2_4_step5_stop_at_the_first_negative_and_ignore_entries_after_a_gap():
    # entry 2 was never written anywhere; entry 3 exists on one replica (a writer's partial add)
    reps = written(3, [[1, 2, 3], [1, 2], [], [1]], lacs=[-1, -1, -1, -1])
    cluster = Cluster(ledger(), reps)
    rec = cluster.run(Recovery(cluster.meta, read_ahead=4))
    assert rec.result.last_entry_id == 1
    assert sorted(cluster.rewritten) == [0, 1]  # entry 3 is beyond the gap: never rewritten


def test_s2_4_step6_close_is_a_cas_and_adopts_another_closer():
    rec = Recovery(ledger(state=LedgerState.IN_RECOVERY))
    rec.start()
    for r in (1, 2):
        rec.on_fence_response(r, F, lac=3, length=cumulative(3))
    rec.on_read_response(4, 1, NSE)
    assert rec.on_read_response(4, 2, NSE) == [CloseLedger(1, 3, cumulative(3), 1)]
    # the CAS lost: another recoverer closed at 5 first; that is the ledger's end now
    assert rec.on_metadata(ledger(state=LedgerState.CLOSED, last=5, length=cumulative(5), version=2)) == []
    assert rec.state is RecoveryState.DONE
    assert (rec.result.last_entry_id, rec.result.our_end) == (5, 3)


def test_s2_4_step6_close_cas_conflict_still_in_recovery_retries():
    rec = Recovery(ledger(state=LedgerState.IN_RECOVERY))
    rec.start()
    for r in (1, 2):
        rec.on_fence_response(r, F, lac=-1)
    rec.on_read_response(0, 1, NSE)
    rec.on_read_response(0, 2, NSE)
    assert rec.on_metadata(ledger(state=LedgerState.IN_RECOVERY, version=5)) == [CloseLedger(1, -1, 0, 5)]
    rec.on_metadata(ledger(state=LedgerState.CLOSED, version=6))
    assert rec.result.our_end == rec.result.last_entry_id == -1


@pytest.mark.parametrize(
    ("name", "setup", "error"),
    [
        (
            "§2.4-7 a fence timeout quorum → LedgerRecovery, retryable",
            lambda reps: [setattr(reps[r], "fence", FT) for r in (1, 2)],
            LedgerRecoveryError,
        ),
        (
            "§2.4-7 Unauthorized passes through",
            lambda reps: setattr(reps[1], "fence", FU),
            UnauthorizedAccessError,
        ),
        (
            "§2.9-4 timeouts are never no-such-entry",
            lambda reps: [reps[r].reads.update({2: TMO}) for r in (2, 3)],
            LedgerRecoveryError,
        ),
        (
            "§2.9-5 a replica that lost acknowledged data answers ERROR: abort, not truncate",
            lambda reps: [reps[1].lost.add(1), reps[2].reads.update({1: TMO})],
            LedgerRecoveryError,
        ),
        (
            "§2.9-5 retention or corruption on two replicas",
            lambda reps: [reps[1].reads.update({1: ERR}), reps[2].reads.update({1: ERR})],
            LedgerRecoveryError,
        ),
    ],
)
def test_s2_4_step7_error_mapping(name, setup, error):
    # entries 0, 1 acknowledged (on 1 and 2), entry 2 never written; replicas piggyback LAC -1
    reps = written(3, [[1, 2], [1, 2]], lacs=[-1, -1])
    setup(reps)
    cluster = Cluster(ledger(), reps)
    rec = cluster.run(Recovery(cluster.meta))
    assert rec.state is RecoveryState.ABORTED and isinstance(rec.error, error)
    assert rec.error.retryable == (error is LedgerRecoveryError)
    assert cluster.meta.state is LedgerState.IN_RECOVERY  # a retry continues from here


def test_s2_4_step8_concurrent_recoveries_converge():
    reps = written(3, [[1, 2, 3], [1, 2], [3]], lacs=[-1, -1, -1])
    cluster = Cluster(ledger(), reps)
    a, b = Recovery(cluster.meta), Recovery(cluster.meta)
    qa = [d for act in a.start() for d in cluster.deliveries(a, act)]
    qb = [d for act in b.start() for d in cluster.deliveries(b, act)]
    # interleave the two recoveries step by step
    while qa or qb:
        for rec, q in ((a, qa), (b, qb)):
            if q:
                q.extend(d for act in q.pop(0)() for d in cluster.deliveries(rec, act))
    assert a.state is b.state is RecoveryState.DONE
    assert a.result.metadata == b.result.metadata == cluster.meta
    assert a.result.our_end == b.result.our_end == 1  # both found the same end; one CAS won


def test_straggler_answers_after_the_end_are_ignored():
    rec = Recovery(ledger(state=LedgerState.IN_RECOVERY))
    rec.start()
    rec.on_fence_response(1, F)
    rec.on_fence_response(2, F)
    rec.on_read_response(0, 1, NSE)
    rec.on_read_response(0, 2, NSE)
    rec.on_metadata(ledger(state=LedgerState.CLOSED, version=2))
    assert rec.on_fence_response(3, F) == []
    assert rec.on_read_response(0, 3, P, payload(0)) == []  # a late copy changes nothing
    with pytest.raises(RecoveryProtocolError):
        rec.on_read_response(7, 3, NSE)  # never asked


# --- §2.2, §2.6, §2.7 the writer -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "lac", "confirmations", "aq", "expected"),
    [
        ("§2.2 nothing confirmed", -1, {}, 2, -1),
        ("§2.2 entry 0 at AQ", -1, {0: 2}, 2, 0),
        ("§2.2 in order only: 1 at AQ, 0 not yet", -1, {0: 1, 1: 3}, 2, -1),
        ("§2.2 a confirmed run", -1, {0: 2, 1: 3, 2: 2, 3: 1}, 2, 2),
        ("§2.2 continues from the current LAC", 4, {5: 1, 6: 1}, 1, 6),
    ],
)
def test_s2_2_lac_advances_in_order(name, lac, confirmations, aq, expected):
    assert advance_lac(lac, confirmations, aq) == expected


def test_s2_2_writer_confirms_in_id_order():
    w = WriterLedger([1, 2, 3], 2)
    assert [w.begin_add(10), w.begin_add(10)] == [0, 1]
    assert w.on_ack(1, 1) == [] and w.on_ack(1, 2) == []  # 1 has AQ, but 0 not yet
    assert w.on_ack(0, 3) == []
    assert w.on_ack(0, 2) == [0, 1]
    assert (w.lac, w.length) == (1, 20)


def test_s2_6_after_fencing_pending_adds_fenced_then_later_adds_closed():
    w = WriterLedger([1, 2, 3], 2)
    for _ in range(3):
        w.begin_add(5)
    w.on_ack(0, 1)
    w.on_ack(0, 2)  # entry 0 was acknowledged before the fence: it stands
    failed = w.on_fenced(1)
    assert sorted(failed) == [1, 2] and all(isinstance(e, LedgerFencedError) for e in failed.values())
    assert failed[1].number == -101
    with pytest.raises(LedgerClosedError) as info:
        w.begin_add(5)
    assert info.value.number == -11
    assert w.on_ack(1, 3) == []  # a late ack changes nothing: recovery decides entry 1
    assert w.on_fenced(2) == {}  # the pending adds failed once
    assert w.lac == 0


def test_s2_7_writer_close_fails_pending_adds_and_ends_at_lac():
    w = WriterLedger([1, 2], 2)
    w.begin_add(3)
    w.begin_add(4)
    w.on_ack(0, 1)
    w.on_ack(0, 2)
    failed, last, length = w.close()
    assert list(failed) == [1] and isinstance(failed[1], LedgerClosedError)
    assert (last, length) == (0, 3)
    with pytest.raises(LedgerClosedError):
        w.begin_add(1)


@pytest.mark.parametrize("e", [1, 2, 3, 4, 5])
def test_s2_6_no_add_reaches_aq_once_fencing_holds(e):
    # E = WQ: after (E − AQ) + 1 fenced replicas, the unfenced ones are fewer than AQ, so a normal
    # add (refused by fenced replicas) can never collect AQ acks
    for aq in range(1, e + 1):
        for fenced in itertools.combinations(range(e), fencing_quorum(e, aq)):
            assert e - len(fenced) < aq


# --- §2.10 properties ------------------------------------------------------------------------------


@st.composite
def histories(draw):
    """A writer's history and what the replicas hold now, consistent with the acks it got.

    Entries 0..n−1 were written; 0..k−1 were acknowledged (each on ≥ AQ replicas). Each entry
    piggybacks a LAC below it and below k (the writer's LAC only covers acknowledged entries)
    that never decreases. Replicas may lose data, time out or fail — but only ever as ERROR or
    TIMEOUT, never as no-such-entry for an entry they had.
    """
    e = draw(st.integers(1, 4))
    aq = draw(st.integers(1, e))
    n = draw(st.integers(0, 5))
    k = draw(st.integers(0, n))
    ids = list(range(1, e + 1))
    replicas = {r: Replica() for r in ids}
    lac = -1
    for i in range(n):
        lac = draw(st.integers(lac, max(lac, min(i - 1, k - 1))))
        lo = aq if i < k else 0
        holders = draw(st.lists(st.sampled_from(ids), min_size=lo, max_size=e, unique=True))
        for r in holders:
            replicas[r].held[i] = lac
    failures = st.sampled_from([ERR, TMO])
    for r in ids:
        rep = replicas[r]
        rep.lost = set(draw(st.lists(st.sampled_from(sorted(rep.held) or [0]), max_size=2))) & set(rep.held)
        rep.fence = draw(st.sampled_from([F, F, F, FE, FT]))
        for entry in range(n + 2):
            if draw(st.integers(0, 5)) == 0:
                rep.reads[entry] = draw(failures)
        rep.rewrite_ok = draw(st.integers(0, 5)) > 0
    return e, aq, n, k, replicas


@settings(max_examples=400, deadline=None)
@given(h=histories(), seed=st.integers(0, 2**32), read_ahead=st.integers(1, 3))
def test_s2_10_recovery_never_closes_below_an_acknowledged_entry(h, seed, read_ahead):
    e, aq, n, k, replicas = h
    cluster = Cluster(ledger(e, aq), replicas)
    rec = cluster.run(Recovery(cluster.meta, read_ahead=read_ahead), random.Random(seed))
    assert rec.state in (RecoveryState.DONE, RecoveryState.ABORTED)  # every run ends
    event(f"{rec.state}, {'some' if k else 'no'} entries acknowledged")
    if rec.state is RecoveryState.ABORTED:
        assert isinstance(rec.error, LedgerRecoveryError) and rec.error.retryable
        assert cluster.meta.state is LedgerState.IN_RECOVERY
        return
    last = rec.result.last_entry_id
    # NoDivergenceBetweenClientAndMetaData: nothing acknowledged lies beyond the seal
    assert k - 1 <= last <= n - 1
    assert cluster.meta.state is LedgerState.CLOSED and cluster.meta.last_entry_id == last
    assert cluster.meta.length == (cumulative(last) if last >= 0 else 0)
    # NoOutOfOrderEntries: what recovery rewrote is what the writer wrote, id for id
    assert all(cluster.rewritten[i] == payload(i) for i in cluster.rewritten)
    # AllCommittedEntriesReachAckQuorum for what recovery wrote back, when it asked to close
    if last > rec.start_lac:
        assert all(cluster.held_at_close[i] >= aq for i in range(rec.start_lac + 1, last + 1))


ANSWERS = st.sampled_from([P, NSE, NSL, ERR, TMO])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), e=st.integers(1, 5))
def test_entry_decision_does_not_depend_on_answer_order(data, e):
    aq = data.draw(st.integers(1, e))
    answers = data.draw(st.lists(ANSWERS, min_size=e, max_size=e))
    orders = [data.draw(st.permutations(range(e))) for _ in range(3)]

    def decide(order):
        t = EntryRecoveryTracker(0, range(e), e, aq)
        for r in order:
            t.on_response(r, answers[r], payload(0) if answers[r] is P else None)
        return t.decision

    decisions = {decide(o) for o in [list(range(e)), *orders]}
    negatives = sum(1 for a in answers if a in (NSE, NSL))
    threshold = negative_quorum(e, aq)
    if P in answers and negatives >= threshold:
        # the one order-dependent case, allowed by the reference (§2.5: the first decisive answer
        # wins): a copy and (WQ − AQ) + 1 "never had it" together, which means fewer than AQ
        # replicas ever held the entry — it was never acknowledged, so either end is safe
        assert decisions <= {RECOVERABLE, UNRECOVERABLE}
        assert e - negatives < aq
    elif P in answers:
        assert decisions == {RECOVERABLE}
    elif negatives >= threshold:
        assert decisions == {UNRECOVERABLE}
    else:
        assert decisions == {ABORT}  # unknown aborts, in every order


@settings(max_examples=300, deadline=None)
@given(data=st.data(), e=st.integers(1, 5))
def test_fencing_does_not_depend_on_answer_order(data, e):
    aq = data.draw(st.integers(1, e))
    answers = data.draw(
        st.lists(st.tuples(st.sampled_from([F, FE, FT]), st.integers(-1, 9)), min_size=e, max_size=e)
    )
    results = set()
    for order in [list(range(e)), data.draw(st.permutations(range(e)))]:
        t = FenceTracker(range(e), aq)
        for r in order:
            t.on_response(r, answers[r][0], lac=answers[r][1], length=answers[r][1] * 10)
        results.add((t.fenced, t.failed, t.max_lac, t.length_at_max_lac))
    assert len(results) == 1
    fenced, failed, max_lac, _ = results.pop()
    assert fenced != failed  # with every answer in, fencing either held or failed
    assert fenced == (sum(1 for o, _ in answers if o is F) >= fencing_quorum(e, aq))
    assert max_lac == max([lac for o, lac in answers if o is F], default=-1)
