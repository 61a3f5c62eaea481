"""Fencing, recovery and the writer's add rules: the pure decision core (no I/O, no clocks).

Theory of operation
-------------------
Recovery answers one question: where does a ledger whose writer may be gone end? It must never
end below an entry the writer acknowledged (an entry that AQ replicas confirmed), and it must
never guess. tidelog ledgers have E = WQ (the ensemble is the broker set, every entry goes to
every replica), so each quorum rule below is the exact one for a single write-set window
(docs/reference/bookkeeper-ledger.md §2.3); the per-window form BookKeeper needs for E > WQ is not implemented, and the
trackers refuse E ≠ WQ.

Two rules carry the safety argument (RULES.md R3, R5):

- **Fencing** holds once (E − AQ) + 1 replicas answered *fenced*. A fenced replica refuses the
  writer's normal adds for good, so at most AQ − 1 replicas can still accept one: no new entry
  can reach AQ. Each fenced answer carries the replica's LAC; every entry ≤ the largest one was
  acknowledged, so reading starts just after it.
- **An entry is unrecoverable** once (WQ − AQ) + 1 replicas answered *no such entry*. Those
  replicas are fenced by the read itself and know they never had it, so at most AQ − 1 replicas
  hold it and it can never reach AQ: it was not acknowledged and never will be. It is
  **recoverable** on the first replica that returns it (its digest already checked by the shell).
  Anything else — all replicas answered without either threshold: timeouts, errors, a replica
  whose data is lost, behind retention or corrupt — is **unknown** and aborts the recovery
  (retryable LedgerRecoveryError). An unknown is never read as "no such entry"; that one mistake
  is what truncates acknowledged data (docs/reference/bookkeeper-ledger.md §2.9, hazards 4 and 5).

The objects, from small to large:

- `FenceTracker`: one fencing round; feed replica answers, read `.fenced`, `.failed`, `.max_lac`.
- `EntryRecoveryTracker`: one entry's recovery read; `.decision` is PENDING, RECOVERABLE,
  UNRECOVERABLE or ABORT. The first decisive answer wins and sticks.
- `Recovery`: the whole recovery as a state machine, in the style of h11 and etcd's raft: every
  `on_*` event returns the list of actions the I/O shell must carry out (mark IN_RECOVERY by CAS,
  send fences, read entry N from all replicas, rewrite entry N, CAS close at L); the shell feeds
  back what happened. States and their allowed moves are the table `RECOVERY_TRANSITIONS`; an
  event the current state does not accept is a `RecoveryProtocolError` (a bug in the shell, never
  a ledger outcome). Late answers to a finished step are ignored on purpose: with several
  replicas answering, stragglers are normal.
- `WriterLedger` and `advance_lac`: the writer's side — LAC advances in order, only over entries
  that AQ replicas confirmed; once a replica answers *fenced*, the pending adds fail with
  LedgerFencedError and every later add with LedgerClosedError.

Timeouts are the shell's business: it reports a replica that did not answer in time as TIMEOUT.
Nothing here reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tidelog.errors import (
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    TidelogError,
    UnauthorizedAccessError,
)
from tidelog.invariants import present, require
from tidelog.ledger.metadata import LedgerMetadata, LedgerState

__all__ = [
    "RECOVERY_TRANSITIONS",
    "RECOVERY_READ_AHEAD",
    "CloseLedger",
    "EntryDecision",
    "EntryRecoveryTracker",
    "FenceOutcome",
    "FenceTracker",
    "MarkInRecovery",
    "ReadEntry",
    "ReadOutcome",
    "Recovery",
    "RecoveryProtocolError",
    "RecoveryResult",
    "RecoveryState",
    "RewriteEntry",
    "SendFence",
    "WriterLedger",
    "advance_lac",
    "fencing_quorum",
    "negative_quorum",
]


class RecoveryProtocolError(Exception):
    """The caller broke the core's protocol (an event the state does not accept, an unknown
    replica, a second answer from one replica). A bug in the caller, never a ledger outcome."""


def fencing_quorum(ensemble_size: int, ack_quorum: int) -> int:
    """Fenced answers needed before no new entry can reach AQ: (E − AQ) + 1."""
    return ensemble_size - ack_quorum + 1


def negative_quorum(write_quorum: int, ack_quorum: int) -> int:
    """No-such-entry answers that prove an entry was never acknowledged: (WQ − AQ) + 1."""
    return write_quorum - ack_quorum + 1


def _check_ensemble(ensemble: Sequence[int], write_quorum: int, ack_quorum: int) -> tuple[int, ...]:
    members = tuple(ensemble)
    if not members or len(set(members)) != len(members):
        raise RecoveryProtocolError(
            f"an ensemble is a non-empty list of distinct replicas, got {list(members)}"
        )
    if write_quorum != len(members):
        # the E > WQ coverage rule is per write-set window (docs/reference/bookkeeper-ledger.md §2.3); tidelog has E = WQ only
        raise RecoveryProtocolError(
            f"tidelog recovery needs E == WQ, got E={len(members)}, WQ={write_quorum}"
        )
    if not 1 <= ack_quorum <= write_quorum:
        raise RecoveryProtocolError(f"ack quorum must be in 1..{write_quorum}, got {ack_quorum}")
    return members


# --- fencing ------------------------------------------------------------------------------


class FenceOutcome(enum.StrEnum):
    FENCED = "FENCED"  # the replica persisted the fence (a replica new to the ledger too, LAC -1)
    ERROR = "ERROR"  # any failure, including lost or corrupt data
    TIMEOUT = "TIMEOUT"  # no answer in time
    UNAUTHORIZED = "UNAUTHORIZED"  # the replica refused our password: stop at once


class FenceTracker:
    """One fencing round over `ensemble` (rules R2, R3).

    `.fenced` once (E − AQ) + 1 replicas answered FENCED; `.failed` once that can no longer
    happen (AQ replicas answered something else) or a replica answered UNAUTHORIZED. Whichever
    comes first sticks. `.max_lac` is the largest LAC among the FENCED answers, never below
    `floor_lac` (the last ensemble's first entry id − 1, docs/reference/bookkeeper-ledger.md §2.4 step 2, defect 2).
    """

    def __init__(
        self,
        ensemble: Sequence[int],
        ack_quorum: int,
        *,
        floor_lac: int = -1,
        floor_length: int | None = None,
    ) -> None:
        self.ensemble = _check_ensemble(ensemble, len(tuple(ensemble)), ack_quorum)
        self.ack_quorum = ack_quorum
        self.needed = fencing_quorum(len(self.ensemble), ack_quorum)
        self.answers: dict[int, FenceOutcome] = {}
        self.max_lac = floor_lac
        # the length through the floor is not in the metadata of an open ledger; unknown (None)
        # unless the caller knows it, except for the empty prefix
        self.length_at_max_lac: int | None = 0 if floor_lac == -1 else floor_length
        self.fenced = False
        self.failed = False
        self.error: TidelogError | None = None

    @property
    def fenced_count(self) -> int:
        return sum(1 for o in self.answers.values() if o is FenceOutcome.FENCED)

    @property
    def pending(self) -> frozenset[int]:
        return frozenset(self.ensemble) - self.answers.keys()

    def on_response(self, replica: int, outcome: FenceOutcome, lac: int = -1, length: int = 0) -> None:
        if replica not in self.ensemble:
            raise RecoveryProtocolError(f"replica {replica} is not in the ensemble {list(self.ensemble)}")
        if replica in self.answers:
            raise RecoveryProtocolError(f"replica {replica} answered the fence twice")
        outcome = FenceOutcome(outcome)
        self.answers[replica] = outcome
        if outcome is FenceOutcome.FENCED:
            if lac < -1:
                raise RecoveryProtocolError(f"a LAC is -1 or an entry id, got {lac}")
            # the largest LAC wins, and for one LAC the largest length (equal on healthy replicas);
            # both are maxima, so the result does not depend on the order of the answers
            known = -1 if self.length_at_max_lac is None else self.length_at_max_lac
            if lac > self.max_lac or (lac == self.max_lac and length > known):
                self.max_lac, self.length_at_max_lac = lac, length
        if self.fenced or self.failed:
            return
        if outcome is FenceOutcome.UNAUTHORIZED:
            self.failed = True
            self.error = UnauthorizedAccessError(
                f"replica {replica} refused the fence: wrong password", replica=replica
            )
        elif self.fenced_count >= self.needed:
            self.fenced = True
        elif len(self.answers) - self.fenced_count > len(self.ensemble) - self.needed:
            self.failed = True
            others = {r: str(o) for r, o in sorted(self.answers.items()) if o is not FenceOutcome.FENCED}
            self.error = LedgerRecoveryError(
                f"fencing cannot complete: {self.needed} of {len(self.ensemble)} replicas must answer fenced, "
                f"{len(others)} answered otherwise ({others})",
                answers=others,
            )


# --- one entry's recovery read ------------------------------------------------------------


class ReadOutcome(enum.StrEnum):
    PRESENT = "PRESENT"  # the entry, digest checked by the shell
    NO_SUCH_ENTRY = "NO_SUCH_ENTRY"  # the replica knows it never had this entry
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"  # the replica knows it never had this ledger (counts as no-such-entry)
    ERROR = "ERROR"  # lost, behind retention, corrupt, failed digest, any other failure
    TIMEOUT = "TIMEOUT"
    UNAUTHORIZED = "UNAUTHORIZED"


_NEGATIVE = frozenset({ReadOutcome.NO_SUCH_ENTRY, ReadOutcome.NO_SUCH_LEDGER})


class EntryDecision(enum.StrEnum):
    PENDING = "PENDING"
    RECOVERABLE = "RECOVERABLE"  # a replica returned it: rewrite it and read the next one
    UNRECOVERABLE = "UNRECOVERABLE"  # (WQ − AQ) + 1 replicas never had it: the ledger ends before it
    ABORT = "ABORT"  # every replica answered and neither held: unknown, never guess


class EntryRecoveryTracker:
    """The recovery read of one entry from every replica of its write set (rules R4–R6)."""

    def __init__(self, entry_id: int, ensemble: Sequence[int], write_quorum: int, ack_quorum: int) -> None:
        if entry_id < 0:
            raise RecoveryProtocolError(f"entry ids start at 0, got {entry_id}")
        self.entry_id = entry_id
        self.write_set = _check_ensemble(ensemble, write_quorum, ack_quorum)
        self.ack_quorum = ack_quorum
        self.needed_negative = negative_quorum(write_quorum, ack_quorum)
        self.answers: dict[int, ReadOutcome] = {}
        self.decision = EntryDecision.PENDING
        self.payload: bytes | None = None
        self.length: int | None = None
        self.error: TidelogError | None = None

    @property
    def negatives(self) -> int:
        return sum(1 for o in self.answers.values() if o in _NEGATIVE)

    def on_response(
        self, replica: int, outcome: ReadOutcome, payload: bytes | None = None, length: int | None = None
    ) -> EntryDecision:
        """Record one replica's answer; return the (possibly unchanged) decision."""
        if replica not in self.write_set:
            raise RecoveryProtocolError(
                f"replica {replica} is not in the write set {list(self.write_set)} of entry {self.entry_id}"
            )
        if replica in self.answers:
            raise RecoveryProtocolError(f"replica {replica} answered entry {self.entry_id} twice")
        outcome = ReadOutcome(outcome)
        if outcome is ReadOutcome.PRESENT and payload is None:
            raise RecoveryProtocolError("a PRESENT answer carries the entry's payload")
        self.answers[replica] = outcome
        if self.decision is not EntryDecision.PENDING:
            return self.decision  # the first decisive answer wins (docs/reference/bookkeeper-ledger.md §2.5)
        if outcome is ReadOutcome.PRESENT:
            self.decision = EntryDecision.RECOVERABLE
            self.payload = payload
            self.length = length
        elif outcome is ReadOutcome.UNAUTHORIZED:
            self.decision = EntryDecision.ABORT
            self.error = UnauthorizedAccessError(
                f"replica {replica} refused the recovery read: wrong password",
                replica=replica,
                entry_id=self.entry_id,
            )
        elif self.negatives >= self.needed_negative:
            self.decision = EntryDecision.UNRECOVERABLE
        elif len(self.answers) == len(self.write_set):
            # no early abort: any replica still to answer could hold the entry
            self.decision = EntryDecision.ABORT
            answers = {r: str(o) for r, o in sorted(self.answers.items())}
            self.error = LedgerRecoveryError(
                f"entry {self.entry_id} is unknown: no replica returned it and only {self.negatives} of the "
                f"{self.needed_negative} needed answered no-such-entry ({answers})",
                entry_id=self.entry_id,
                answers=answers,
            )
        return self.decision


# --- the whole recovery -------------------------------------------------------------------


@dataclass(frozen=True)
class MarkInRecovery:
    """CAS the metadata from OPEN to IN_RECOVERY, expecting `expected_version`."""

    ledger_id: int
    expected_version: int


@dataclass(frozen=True)
class SendFence:
    """Send a fence request to each replica; each answers FENCED with its LAC and length, or fails."""

    ledger_id: int
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class ReadEntry:
    """Read `entry_id` from each replica. The read fences too (docs/reference/bookkeeper-ledger.md §2.9 hazard 1): a replica
    that answers no-such-entry must also refuse the writer's later add of it."""

    ledger_id: int
    entry_id: int
    replicas: tuple[int, ...]
    fence: bool = True


@dataclass(frozen=True)
class RewriteEntry:
    """Write a recovered entry again (a recovery add: accepted by fenced replicas) until AQ
    replicas confirm it; report each replica's confirmation or failure."""

    ledger_id: int
    entry_id: int
    payload: bytes
    length: int  # the ledger's cumulative length through this entry; -1 if not known (floor case, R4)
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class CloseLedger:
    """CAS the metadata from IN_RECOVERY to CLOSED at (`last_entry_id`, `length`)."""

    ledger_id: int
    last_entry_id: int
    length: int
    expected_version: int


Action = MarkInRecovery | SendFence | ReadEntry | RewriteEntry | CloseLedger


@dataclass(frozen=True)
class RecoveryResult:
    """Where the ledger ends, and the metadata that says so (ours, or another closer's).

    `our_end` is the end this recovery decided, or None if it adopted an end before deciding
    one. It can differ from `last_entry_id` only when someone else closed first; whose CAS won
    is the shell's knowledge, not the core's."""

    last_entry_id: int
    length: int
    metadata: LedgerMetadata
    our_end: int | None


class RecoveryState(enum.StrEnum):
    MARKING = "MARKING"  # waiting for the OPEN → IN_RECOVERY CAS
    FENCING = "FENCING"  # fences sent, waiting for (E − AQ) + 1 fenced answers
    READING = "READING"  # reading forward from max LAC + 1, rewriting what is found
    DRAINING = "DRAINING"  # the end is known; waiting until every rewrite has AQ confirmations
    CLOSING = "CLOSING"  # the IN_RECOVERY → CLOSED CAS is out
    DONE = "DONE"  # the ledger is CLOSED; `result` says where it ends
    ABORTED = "ABORTED"  # unknown or refused; `error` says why; retry the whole recovery


# Every move the machine may make; `_move` asserts against it, so a transition the table does not
# allow is a bug here, not in the caller.
RECOVERY_TRANSITIONS: dict[RecoveryState, frozenset[RecoveryState]] = {
    RecoveryState.MARKING: frozenset({RecoveryState.FENCING, RecoveryState.DONE}),
    RecoveryState.FENCING: frozenset({RecoveryState.READING, RecoveryState.ABORTED, RecoveryState.DONE}),
    RecoveryState.READING: frozenset(
        {RecoveryState.DRAINING, RecoveryState.CLOSING, RecoveryState.ABORTED, RecoveryState.DONE}
    ),
    RecoveryState.DRAINING: frozenset({RecoveryState.CLOSING, RecoveryState.ABORTED, RecoveryState.DONE}),
    RecoveryState.CLOSING: frozenset({RecoveryState.DONE}),
    RecoveryState.DONE: frozenset(),
    RecoveryState.ABORTED: frozenset(),
}


# The `read_ahead` tidelog's recovery shells use (the client's, ledger/recovery_run.py, and the
# simulator's). A writer that dies leaves its last acknowledged entry beyond the LAC its entries
# carried: with 2, that entry and the absent one after it are asked in the same round trip.
RECOVERY_READ_AHEAD = 2


class Recovery:
    """One recovery open of one ledger, as a state machine handing back actions.

    Create it with the metadata just read; `start()` returns the first actions. Then feed every
    outcome to the matching `on_*` method and carry out what it returns, until `state` is DONE
    (read `result`) or ABORTED (raise `error`; it is retryable unless it is UnauthorizedAccess).

    `read_ahead` entries are read at a time (default 1, BookKeeper's sequential default);
    decisions are still taken strictly in entry order, and nothing after the first
    unrecoverable entry is rewritten.
    """

    def __init__(
        self, metadata: LedgerMetadata, *, read_ahead: int = 1, floor_length: int | None = None
    ) -> None:
        if read_ahead < 1:
            raise RecoveryProtocolError(f"read_ahead must be at least 1, got {read_ahead}")
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.read_ahead = read_ahead
        self.floor_length = floor_length  # the length through the last ensemble's first entry − 1, if known
        self.state = RecoveryState.MARKING
        self.result: RecoveryResult | None = None
        self.error: TidelogError | None = None
        self.fence: FenceTracker | None = None
        self.replicas: tuple[int, ...] = metadata.replicas
        self.start_lac: int | None = None
        self._started = False
        self._reads: dict[int, EntryRecoveryTracker] = {}
        self._next_to_decide = 0
        self._next_to_read = 0
        self._end: int | None = None  # last entry id to close at, once known
        self._length: int | None = 0  # cumulative length through the last recovered entry
        self._rewrites: dict[int, set[int]] = {}  # entry → replicas that confirmed its rewrite
        self._rewrite_failures: dict[int, set[int]] = {}

    # --- plumbing --------------------------------------------------------------------------

    def _move(self, to: RecoveryState) -> None:
        require(to in RECOVERY_TRANSITIONS[self.state], f"recovery may not move {self.state} -> {to}")
        self.state = to

    def _finish(self, meta: LedgerMetadata) -> list[Action]:
        require(
            meta.state is LedgerState.CLOSED, f"recovery finished with ledger {meta.ledger_id} {meta.state}"
        )
        self.metadata = meta
        self.result = RecoveryResult(meta.last_entry_id, meta.length, meta, self._end)
        self._move(RecoveryState.DONE)
        return []

    def _abort(self, error: TidelogError) -> list[Action]:
        self.error = error
        self._move(RecoveryState.ABORTED)
        return []

    def _expect(self, *states: RecoveryState, event: str) -> None:
        if self.state not in states:
            raise RecoveryProtocolError(f"{event} is not accepted in state {self.state}")

    def _check_ledger(self, meta: LedgerMetadata) -> None:
        if meta.ledger_id != self.ledger_id:
            raise RecoveryProtocolError(
                f"metadata of ledger {meta.ledger_id} fed to the recovery of {self.ledger_id}"
            )

    # --- events ----------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """The first actions. A CLOSED ledger finishes here: no CAS, no fence (rule R1)."""
        if self._started:
            raise RecoveryProtocolError("start() was already called")
        self._started = True
        meta = self.metadata
        if meta.state is LedgerState.CLOSED:
            return self._finish(meta)
        if meta.state is LedgerState.IN_RECOVERY:
            return self._begin_fencing(meta)  # another recovery began; join it without a CAS
        return [MarkInRecovery(self.ledger_id, meta.version)]

    def on_metadata(self, meta: LedgerMetadata) -> list[Action]:
        """The metadata after a CAS we sent (won or lost), or as re-read after a conflict."""
        if not self._started:
            raise RecoveryProtocolError("call start() first")
        self._check_ledger(meta)
        if self.state in (RecoveryState.DONE, RecoveryState.ABORTED):
            return []
        if meta.state is LedgerState.CLOSED:
            # someone (this recovery's CAS, another recoverer) closed it: that is the end now
            return self._finish(meta)
        if self.state is RecoveryState.MARKING:
            if meta.state is LedgerState.IN_RECOVERY:
                return self._begin_fencing(meta)
            # still OPEN (the CAS lost to another change, e.g. a new ensemble): try again on it
            self.metadata = meta
            return [MarkInRecovery(self.ledger_id, meta.version)]
        if meta.state is LedgerState.OPEN:
            raise RecoveryProtocolError("the metadata went back to OPEN during recovery")
        self.metadata = meta
        if self.state is RecoveryState.CLOSING:
            # the close CAS lost to another change that left it IN_RECOVERY: retry on the new version
            end = present(self._end, "closing without a recovered end")
            length = present(self._length, "closing without a recovered length")
            return [CloseLedger(self.ledger_id, end, length, meta.version)]
        return []  # IN_RECOVERY while fencing/reading: nothing new

    def _begin_fencing(self, meta: LedgerMetadata) -> list[Action]:
        # the ensemble snapshot for the whole recovery (docs/reference/bookkeeper-ledger.md §2.4 step 3, §2.9 hazard 3)
        self.metadata = meta
        self.replicas = meta.replicas
        self.fence = FenceTracker(
            self.replicas,
            meta.ack_quorum,
            floor_lac=meta.last_ensemble_first_entry - 1,
            floor_length=self.floor_length,
        )
        self._move(RecoveryState.FENCING)
        return [SendFence(self.ledger_id, self.replicas)]

    def on_fence_response(
        self, replica: int, outcome: FenceOutcome, lac: int = -1, length: int = 0
    ) -> list[Action]:
        self._expect(
            RecoveryState.FENCING,
            RecoveryState.READING,
            RecoveryState.DRAINING,
            RecoveryState.CLOSING,
            RecoveryState.DONE,
            RecoveryState.ABORTED,
            event="a fence answer",
        )
        if self.fence is None:
            # DONE/ABORTED without ever fencing (a CLOSED ledger): no fence was sent
            raise RecoveryProtocolError("no fence was sent")
        self.fence.on_response(replica, outcome, lac, length)
        if self.state is not RecoveryState.FENCING:
            return []  # a straggler: the start point is already fixed
        if self.fence.failed:
            return self._abort(present(self.fence.error, "a failed fence without its error"))
        if not self.fence.fenced:
            return []
        self.start_lac = self.fence.max_lac
        self._length = self.fence.length_at_max_lac
        self._next_to_decide = self._next_to_read = self.start_lac + 1
        self._move(RecoveryState.READING)
        return self._fill_reads()

    def _fill_reads(self) -> list[Action]:
        actions: list[Action] = []
        while self._end is None and self._next_to_read < self._next_to_decide + self.read_ahead:
            entry = self._next_to_read
            self._reads[entry] = EntryRecoveryTracker(
                entry, self.replicas, self.metadata.write_quorum, self.metadata.ack_quorum
            )
            actions.append(ReadEntry(self.ledger_id, entry, self.replicas))
            self._next_to_read += 1
        return actions

    def on_read_response(
        self,
        entry_id: int,
        replica: int,
        outcome: ReadOutcome,
        payload: bytes | None = None,
        length: int | None = None,
    ) -> list[Action]:
        """One replica's answer to `ReadEntry(entry_id)`. `length` is the cumulative ledger
        length the entry carries, if the shell has it; otherwise it is computed from payloads."""
        self._expect(
            RecoveryState.READING,
            RecoveryState.DRAINING,
            RecoveryState.CLOSING,
            RecoveryState.DONE,
            RecoveryState.ABORTED,
            event="a read answer",
        )
        tracker = self._reads.get(entry_id)
        if tracker is None:
            if self.start_lac is not None and self.start_lac < entry_id < self._next_to_read:
                return []  # an entry already decided (its tracker is gone): a straggler
            raise RecoveryProtocolError(f"entry {entry_id} was not asked for")
        tracker.on_response(replica, outcome, payload, length)
        if self.state is not RecoveryState.READING:
            return []
        actions: list[Action] = []
        # decide strictly in entry order: an entry after a gap is never recovered (§2.4 step 5)
        while self.state is RecoveryState.READING:
            head = self._reads.get(self._next_to_decide)
            if head is None or head.decision is EntryDecision.PENDING:
                break
            del self._reads[head.entry_id]
            if head.decision is EntryDecision.ABORT:
                return self._abort(present(head.error, "an aborted read without its error"))
            if head.decision is EntryDecision.UNRECOVERABLE:
                self._end = head.entry_id - 1
                self._reads.clear()  # reads beyond the end are ignored from now on
                self._move(RecoveryState.DRAINING)
                actions.extend(self._maybe_close())
                break
            payload = present(head.payload, f"entry {head.entry_id} to rewrite has no payload")
            # entries carry the cumulative length; without it, count on from the known length
            if head.length is not None:
                self._length = head.length
            elif self._length is not None:
                self._length += len(payload)
            self._rewrites[head.entry_id] = set()
            self._rewrite_failures[head.entry_id] = set()
            actions.append(
                RewriteEntry(
                    self.ledger_id,
                    head.entry_id,
                    payload,
                    -1 if self._length is None else self._length,
                    self.replicas,
                )
            )
            self._next_to_decide += 1
        actions.extend(self._fill_reads())
        return actions

    def on_rewrite_response(self, entry_id: int, replica: int, ok: bool) -> list[Action]:
        """One replica confirmed (`ok`) or failed the rewrite of `entry_id`."""
        self._expect(
            RecoveryState.READING,
            RecoveryState.DRAINING,
            RecoveryState.CLOSING,
            RecoveryState.DONE,
            RecoveryState.ABORTED,
            event="a rewrite answer",
        )
        if entry_id not in self._rewrites:
            raise RecoveryProtocolError(f"entry {entry_id} was not rewritten")
        if replica not in self.replicas:
            raise RecoveryProtocolError(f"replica {replica} is not in the ensemble {list(self.replicas)}")
        if replica in self._rewrites[entry_id] or replica in self._rewrite_failures[entry_id]:
            raise RecoveryProtocolError(f"replica {replica} answered the rewrite of {entry_id} twice")
        (self._rewrites if ok else self._rewrite_failures)[entry_id].add(replica)
        if self.state not in (RecoveryState.READING, RecoveryState.DRAINING):
            return []
        if len(self._rewrite_failures[entry_id]) > len(self.replicas) - self.metadata.ack_quorum:
            # AQ confirmations are out of reach; closing now would claim an entry fewer than AQ hold
            return self._abort(
                LedgerRecoveryError(
                    f"the rewrite of entry {entry_id} cannot reach {self.metadata.ack_quorum} replicas "
                    f"(failed on {sorted(self._rewrite_failures[entry_id])})",
                    entry_id=entry_id,
                )
            )
        return self._maybe_close()

    def _maybe_close(self) -> list[Action]:
        if self.state is not RecoveryState.DRAINING:
            return []
        aq = self.metadata.ack_quorum
        if any(len(confirmed) < aq for confirmed in self._rewrites.values()):
            return []  # close only once every rewrite is safe (§2.4 step 5)
        end = present(self._end, "closing without a recovered end")
        require(
            self.start_lac is not None and end >= self.start_lac,
            f"closing at end {end} below the start LAC {self.start_lac}",
        )
        if self._length is None:
            # the end is at the ensemble floor and no entry told us the length there: writing a
            # made-up length into the metadata would be a guess
            return self._abort(
                LedgerRecoveryError(
                    f"the ledger ends at {self._end}, the last ensemble's floor, and its length there is unknown; "
                    f"retry with floor_length",
                    entry_id=self._end,
                )
            )
        self._move(RecoveryState.CLOSING)
        return [CloseLedger(self.ledger_id, end, self._length, self.metadata.version)]


# --- the writer's side --------------------------------------------------------------------


def advance_lac(lac: int, confirmations: Mapping[int, int], ack_quorum: int) -> int:
    """The LAC after `confirmations` (entry id → replicas that confirmed it): it moves only in
    order, over entries that each have at least `ack_quorum` confirmations (rule W1)."""
    while confirmations.get(lac + 1, 0) >= ack_quorum:
        lac += 1
    return lac


class _AckCounts(Mapping[int, int]):
    """Entry id → how many replicas confirmed it, read through from the writer's ack sets."""

    def __init__(self, acks: Mapping[int, set[int]]) -> None:
        self._acks = acks

    def __getitem__(self, entry_id: int) -> int:
        return len(self._acks[entry_id])

    def __iter__(self) -> Iterator[int]:
        return iter(self._acks)

    def __len__(self) -> int:
        return len(self._acks)


class WriterLedger:
    """The writer handle's add bookkeeping (rules W1–W3). Entry ids are handed out 0, 1, 2, …

    - `begin_add(size)` gives the next entry id, or raises LedgerClosedError once the handle is
      closed (by `close()` or by a fence).
    - `on_ack(entry, replica)` returns the entries newly confirmed, in id order; the LAC is the
      last of them.
    - `on_fenced(entry)` (a replica answered *fenced*): every pending add fails with
      LedgerFencedError — its outcome is unknown, recovery decides — and the handle is closed, so
      the next `begin_add` raises LedgerClosedError.
    """

    def __init__(
        self, replicas: Sequence[int], ack_quorum: int, *, last_add_confirmed: int = -1, length: int = 0
    ) -> None:
        self.replicas = _check_ensemble(replicas, len(tuple(replicas)), ack_quorum)
        self.ack_quorum = ack_quorum
        self.lac = last_add_confirmed
        self.lap = last_add_confirmed  # last add pushed
        self.length = length  # cumulative length through the LAC
        self._lengths: dict[int, int] = {}
        self._acks: dict[int, set[int]] = {}
        self.closed = False
        self.fenced = False

    @property
    def pending(self) -> tuple[int, ...]:
        return tuple(range(self.lac + 1, self.lap + 1))

    def begin_add(self, size: int) -> int:
        if self.closed:
            raise LedgerClosedError(
                "the ledger handle is closed" + (" (fenced by a recovery)" if self.fenced else ""),
                last_add_confirmed=self.lac,
            )
        if size < 0:
            raise IncorrectParameterError(f"an entry's size is not negative, got {size}")
        self.lap += 1
        previous = self._lengths.get(self.lap - 1, self.length)
        self._lengths[self.lap] = previous + size
        self._acks[self.lap] = set()
        return self.lap

    def on_ack(self, entry_id: int, replica: int) -> list[int]:
        if replica not in self.replicas:
            raise RecoveryProtocolError(f"replica {replica} is not in the ensemble {list(self.replicas)}")
        if self.closed or entry_id <= self.lac:
            return []  # a late ack: the entry is confirmed already, or was failed by the fence/close
        if entry_id > self.lap:
            raise RecoveryProtocolError(f"entry {entry_id} was never added")
        self._acks[entry_id].add(replica)
        # a view, not a copy: with many adds in flight, copying every pending add's count per ack
        # made confirming n pipelined adds cost O(n²)
        new_lac = advance_lac(self.lac, _AckCounts(self._acks), self.ack_quorum)
        confirmed = list(range(self.lac + 1, new_lac + 1))
        for e in confirmed:
            del self._acks[e]
        if confirmed:
            self.lac = new_lac
            self.length = self._lengths[new_lac]
            for e in confirmed:
                del self._lengths[e]
        return confirmed

    def on_fenced(self, entry_id: int) -> dict[int, TidelogError]:
        """A replica refused `entry_id` as fenced: the error each pending add fails with.

        A fence after the handle is closed fails nothing more (those adds already failed)."""
        if self.closed:
            return {}
        failed: dict[int, TidelogError] = {
            e: LedgerFencedError(
                f"entry {e}: the ledger was fenced by a recovery; whether the entry exists "
                f"is for the recovery to decide",
                entry_id=e,
                fenced_at=entry_id,
            )
            for e in self.pending
        }
        self.closed = True
        self.fenced = True
        self._acks.clear()
        return failed

    def close(self) -> tuple[dict[int, TidelogError], int, int]:
        """Seal the handle: (the error of each pending add, last entry id, length to CAS).

        The end is the LAC, not the last add pushed: only confirmed entries are the writer's to
        claim (docs/reference/bookkeeper-ledger.md §2.7)."""
        failed: dict[int, TidelogError] = (
            {}
            if self.closed
            else {
                e: LedgerClosedError(
                    f"entry {e}: the handle was closed before AQ replicas confirmed it", entry_id=e
                )
                for e in self.pending
            }
        )
        self.closed = True
        self._acks.clear()
        return failed, self.lac, self.length
