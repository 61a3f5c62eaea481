"""A ledger written through the modelled brokers, its writer lost, and its recovery, under the seed's faults.

Real code (`ledger/recovery.py`): `WriterLedger` (entry ids, acks, the LAC, a fenced writer's
pending adds failing and its later adds refused), `Recovery` (mark IN_RECOVERY by CAS, fence with
`FenceTracker`, read forward from the largest fenced LAC with `EntryRecoveryTracker`'s quorum
coverage, rewrite, close by CAS), and `LedgerMetadata` for the states and their checks.

Modelled, and kept small:

- each broker's ledger store (`Store`): entries, the fenced flag, the largest LAC an add carried.
  A replica answers an add after its fsync, so a crash keeps every entry it acknowledged; a
  fenced replica refuses the writer's adds and accepts a recovery's rewrites; a recovery read
  fences. A broker that is down, paused or fail-stopped answers nothing.
- the metadata store: one CAS register (the controllers' Raft log is linearizable; the simulator
  does not route these calls through its Raft model).
- the writer's and the recoverers' RPC shells: a request to every replica of the ensemble; each
  replica's first answer is taken (a duplicate is dropped); a replica that did not answer within
  `TIMEOUT_MS` is reported TIMEOUT; the writer sends an add again to the replicas that have not
  confirmed it every second (a reconnect), and has up to three adds in flight.
- the writer's end: at a time drawn from the seed it either crashes for good or pauses (SIGSTOP)
  for 6-12 s and then writes on; two recoverers, which take the writer for dead, start recoveries
  1-3 s later, and start again a second after a recovery aborts.

Both clients are in datacenter dc0 with the producer: the network's loss, delay and duplication
reach them, partitions do not (as for the producer, a partition cuts replicas from each other).

Checked (`Checker`): every entry confirmed to the writer is in the closed ledger (at or below its
last entry id, the entries up to it readable with the writer's payload); a closed ledger's end
never changes; no add the writer begins after the close is confirmed; and, after the last fault
heals, the ledger is closed within the liveness window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from random import Random
from typing import TYPE_CHECKING

from tidelog.errors import LedgerClosedError
from tidelog.ledger import recovery as rc
from tidelog.ledger.metadata import LedgerMetadata, LedgerState

from .checker import Violation
from .net import Node, Sim

if TYPE_CHECKING:
    from .broker import Broker

LEDGER_ID = 1
ADD_EVERY = 300  # the writer begins an add this often (local ms)
IN_FLIGHT = 3  # adds not yet confirmed, at most
RESEND_MS = 1000
TIMEOUT_MS = 2000  # a replica that did not answer within this is TIMEOUT to the recovery
RETRY_MS = 1000  # an aborted recovery starts again after this


@dataclass
class Store:
    """One broker's copy of the ledger."""

    entries: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # entry -> (payload, length)
    fenced: bool = False
    lac: int = -1

    def length_at(self, entry: int) -> int:
        return 0 if entry < 0 else self.entries.get(entry, (b"", 0))[1]


class MetaStore:
    """The ledger's metadata: a compare-and-set register."""

    def __init__(self, meta: LedgerMetadata, checker: Checker) -> None:
        self.meta = meta
        self.checker = checker

    def cas(self, new: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        old = self.meta
        if old.version == expected_version:
            self.meta = replace(new, version=old.version + 1)
            self.checker.on_meta(old, self.meta)
        return self.meta


class Checker:
    """The ledger's properties (module docstring)."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.payloads: dict[int, bytes] = {}  # entry -> what the writer wrote
        self.confirmed: set[int] = set()
        self.closed: LedgerMetadata | None = None
        self.begun_after_close: set[int] = set()

    def on_begin(self, entry: int, payload: bytes) -> None:
        self.payloads[entry] = payload
        if self.closed is not None:
            self.begun_after_close.add(entry)

    def on_confirmed(self, entries: list[int]) -> None:
        self.confirmed.update(entries)
        closed = self.closed
        for e in entries:
            if e in self.begun_after_close:
                raise Violation(
                    f"ledger: the fenced writer's add of entry {e}, begun after the close, was confirmed"
                )
            if closed is not None and e > closed.last_entry_id:
                raise Violation(
                    f"ledger: entry {e} confirmed to the writer after the ledger closed at {closed.last_entry_id}"
                )

    def on_meta(self, old: LedgerMetadata, new: LedgerMetadata) -> None:
        self.sim.tr(
            "ledger metadata v%d: %s last %d length %d", new.version, new.state, new.last_entry_id, new.length
        )
        if old.state is LedgerState.CLOSED and (new.state, new.last_entry_id, new.length) != (
            old.state,
            old.last_entry_id,
            old.length,
        ):
            raise Violation(
                f"ledger: closed at {old.last_entry_id} and changed to {new.state} {new.last_entry_id}"
            )
        if new.state is LedgerState.CLOSED and old.state is not LedgerState.CLOSED:
            self.closed = new
            self.check_closed(new, stores=None)

    def check_closed(self, meta: LedgerMetadata, stores: dict[int, Store] | None) -> None:
        lost = sorted(e for e in self.confirmed if e > meta.last_entry_id)
        if lost:
            raise Violation(
                f"ledger: closed at {meta.last_entry_id}, but entries {lost[:5]} were confirmed to the writer"
            )
        if stores is None:
            return
        for e in range(meta.last_entry_id + 1):
            held = [s.entries[e][0] for s in stores.values() if e in s.entries]
            if not held:
                raise Violation(f"ledger: entry {e} of the closed ledger is on no replica")
            if any(p != self.payloads.get(e) for p in held):
                raise Violation(f"ledger: entry {e} on a replica is not what the writer wrote")


class LedgerModel:
    """The stores on the brokers, the metadata, the writer and two recoverers of one seed."""

    def __init__(self, sim: Sim, brokers: dict[int, Broker], seed: int) -> None:
        # its own draws, for its messages too: the rest of the world runs as it would without it
        self.rng = rng = Random(seed * 7919 + 2)
        self.sim = sim
        self.brokers = brokers
        self.stores = {bid: Store() for bid in brokers}
        n = len(brokers)
        aq = 2 if n == 3 else rng.choice((1, 2))
        self.checker = Checker(sim)
        meta = LedgerMetadata(
            ledger_id=LEDGER_ID,
            broker_set="bs",
            ensemble_size=n,
            write_quorum=n,
            ack_quorum=aq,
            ensembles=((0, tuple(sorted(brokers))),),
        )
        self.metastore = MetaStore(meta, self.checker)
        self.writer = Writer(sim, self, meta)
        lost_at = 5000 + rng.randrange(40_000)
        pause = 0 if rng.random() < 0.5 else 6000 + rng.randrange(6000)
        self.recoverers = [Recoverer(sim, self, f"lr{i}") for i in (1, 2)]
        sim.at(lost_at, self._lose_writer, pause)
        begins = [lost_at + 1000 + rng.randrange(2000) for _ in self.recoverers]
        for r, t in zip(self.recoverers, begins, strict=True):
            sim.at(t, r.begin)
        self.recovery_from = max(begins)  # the liveness window starts no earlier
        self.scenario = f"ledger E=WQ={n} AQ={aq}, writer {'paused' if pause else 'crashed'} at {lost_at} ms"

    def _lose_writer(self, pause: int) -> None:
        w = self.writer
        if pause:
            w.paused_until = self.sim.now + pause
            self.sim.tr("ledger writer paused for %d ms", pause)
        else:
            w.up, w.inc = False, w.inc + 1
            self.sim.tr("ledger writer crashed")

    def serving(self, bid: int) -> Store | None:
        """The store of a broker that can answer now (its process runs and its disk works)."""
        b = self.brokers[bid]
        return None if b.stopped else self.stores[bid]

    # ------------------------------------------------------------------ a replica's handlers

    def on_add(
        self, src: Writer | Recoverer, att: int, bid: int, entry: int, payload: bytes, length: int, lac: int
    ) -> None:
        """An add (`att` 0: the writer's) or a recovery's rewrite (`att`: its attempt)."""
        store = self.serving(bid)
        if store is None:
            return
        b = self.brokers[bid]
        if store.fenced and not att:
            self.sim.send(b, src, src.on_add_reply, att, bid, entry, False, rng=self.rng)
            return
        store.entries.setdefault(entry, (payload, length))
        if lac in store.entries:  # the LAC it reports is one it can give the length of
            store.lac = max(store.lac, lac)
        self.sim.send(b, src, src.on_add_reply, att, bid, entry, True, rng=self.rng)

    def on_fence(self, r: Recoverer, attempt: int, bid: int) -> None:
        store = self.serving(bid)
        if store is None:
            return
        store.fenced = True
        lac = store.lac
        self.sim.send(
            self.brokers[bid], r, r.on_fenced, attempt, bid, lac, store.length_at(lac), rng=self.rng
        )

    def on_read(self, r: Recoverer, attempt: int, bid: int, entry: int, fence: bool) -> None:
        store = self.serving(bid)
        if store is None:
            return
        store.fenced = store.fenced or fence
        got = store.entries.get(entry)
        self.sim.send(self.brokers[bid], r, r.on_read, attempt, bid, entry, got, rng=self.rng)

    def final(self) -> None:
        meta = self.metastore.meta
        if meta.state is not LedgerState.CLOSED:
            raise Violation(f"liveness: the ledger is still {meta.state} after the last fault healed")
        self.checker.check_closed(meta, self.stores)


class Writer(Node):
    """The ledger's writer: `WriterLedger` and its add shell."""

    def __init__(self, sim: Sim, model: LedgerModel, meta: LedgerMetadata) -> None:
        super().__init__(sim, "lw", "dc0")
        self.model = model
        self.wl = rc.WriterLedger(meta.replicas, meta.ack_quorum)
        self.adds: dict[int, tuple[bytes, int]] = {}  # entry -> (payload, length), not yet confirmed
        self.heard: dict[int, set[int]] = {}  # entry -> replicas that answered
        self.length = 0
        self.refused = 0
        self.after(ADD_EVERY, self.add)
        self.after(RESEND_MS, self.resend)

    def add(self) -> None:
        self.after(ADD_EVERY, self.add)
        if len(self.adds) >= IN_FLIGHT:
            return
        size = 1 + self.model.rng.randrange(100)
        try:
            entry = self.wl.begin_add(size)
        except LedgerClosedError:
            self.refused += 1
            return
        payload = f"entry {entry}".encode()
        self.length += size
        self.adds[entry] = (payload, self.length)
        self.heard[entry] = set()
        self.model.checker.on_begin(entry, payload)
        for bid in self.wl.replicas:
            self._send(bid, entry)

    def _send(self, bid: int, entry: int) -> None:
        payload, length = self.adds[entry]
        m = self.model
        self.sim.send(
            self, m.brokers[bid], m.on_add, self, 0, bid, entry, payload, length, self.wl.lac, rng=m.rng
        )

    def resend(self) -> None:
        self.after(RESEND_MS, self.resend)
        for entry in sorted(self.adds):
            for bid in self.wl.replicas:
                if bid not in self.heard[entry]:
                    self._send(bid, entry)

    def on_add_reply(self, att: int, bid: int, entry: int, ok: bool) -> None:
        del att  # the writer's adds
        if entry not in self.adds or bid in self.heard[entry]:
            return  # confirmed or failed already, or a duplicate answer
        self.heard[entry].add(bid)
        if not ok:
            failed = self.wl.on_fenced(entry)
            if failed:
                self.sim.tr("ledger writer fenced at entry %d: adds %s fail", entry, sorted(failed))
            self.adds.clear()
            return
        confirmed = self.wl.on_ack(entry, bid)
        for e in confirmed:
            self.adds.pop(e, None)
        if confirmed:
            self.model.checker.on_confirmed(confirmed)


class Recoverer(Node):
    """A client that opens the ledger for recovery: `Recovery` and its shell."""

    def __init__(self, sim: Sim, model: LedgerModel, name: str) -> None:
        super().__init__(sim, name, "dc0")
        self.model = model
        self.attempt = 0
        self.rec: rc.Recovery | None = None
        self.answered: set[tuple[str, int, int]] = set()  # (step, entry, replica) of this attempt

    def begin(self) -> None:
        self.attempt += 1
        self.answered = set()
        self.rec = rc.Recovery(self.model.metastore.meta, read_ahead=rc.RECOVERY_READ_AHEAD)  # as the client
        self.sim.tr("%s recovers the ledger (attempt %d)", self.name, self.attempt)
        self._carry(self.rec.start())

    def _carry(self, actions: list[rc.Action]) -> None:
        for a in actions:
            self._do(a)
        rec = self.rec
        if rec is None:
            return
        if rec.state is rc.RecoveryState.DONE and rec.result is not None:
            self.sim.tr("%s: the ledger ends at %d", self.name, rec.result.last_entry_id)
            self.rec = None
        elif rec.state is rc.RecoveryState.ABORTED:
            self.sim.tr("%s: recovery aborted: %s", self.name, str(rec.error)[:120])
            self.rec = None
            self.after(RETRY_MS, self.begin)

    def _do(self, a: rc.Action) -> None:
        model, att = self.model, self.attempt
        if isinstance(a, rc.MarkInRecovery):
            meta = model.metastore.meta
            self.after(5, self._cas, att, replace(meta, state=LedgerState.IN_RECOVERY), a.expected_version)
        elif isinstance(a, rc.CloseLedger):
            meta = model.metastore.meta
            closed = replace(meta, state=LedgerState.CLOSED, last_entry_id=a.last_entry_id, length=a.length)
            self.after(5, self._cas, att, closed, a.expected_version)
        elif isinstance(a, rc.SendFence):
            for bid in a.replicas:
                self.sim.send(self, model.brokers[bid], model.on_fence, self, att, bid, rng=model.rng)
            self.after(TIMEOUT_MS, self._timeout, att, "fence", -1, a.replicas)
        elif isinstance(a, rc.ReadEntry):
            for bid in a.replicas:
                b = model.brokers[bid]
                self.sim.send(self, b, model.on_read, self, att, bid, a.entry_id, a.fence, rng=model.rng)
            self.after(TIMEOUT_MS, self._timeout, att, "read", a.entry_id, a.replicas)
        elif isinstance(a, rc.RewriteEntry):
            for bid in a.replicas:
                b = model.brokers[bid]
                args = (self, att, bid, a.entry_id, a.payload, a.length, -1)
                self.sim.send(self, b, model.on_add, *args, rng=model.rng)
            self.after(TIMEOUT_MS, self._timeout, att, "rewrite", a.entry_id, a.replicas)

    def _first(self, att: int, step: str, entry: int, bid: int) -> bool:
        """True for the first answer of `bid` to this step of the current attempt."""
        if att != self.attempt or self.rec is None:
            return False
        key = (step, entry, bid)
        if key in self.answered:
            return False
        self.answered.add(key)
        return True

    def _cas(self, att: int, new: LedgerMetadata, expected: int) -> None:
        if att == self.attempt and self.rec is not None:
            self._carry(self.rec.on_metadata(self.model.metastore.cas(new, expected)))

    def on_fenced(self, att: int, bid: int, lac: int, length: int) -> None:
        if self._first(att, "fence", -1, bid) and self.rec is not None:
            self._carry(self.rec.on_fence_response(bid, rc.FenceOutcome.FENCED, lac, length))

    def on_read(self, att: int, bid: int, entry: int, got: tuple[bytes, int] | None) -> None:
        if not self._first(att, "read", entry, bid) or self.rec is None:
            return
        if got is None:
            self._carry(self.rec.on_read_response(entry, bid, rc.ReadOutcome.NO_SUCH_ENTRY))
        else:
            self._carry(self.rec.on_read_response(entry, bid, rc.ReadOutcome.PRESENT, got[0], got[1]))

    def on_add_reply(self, att: int, bid: int, entry: int, ok: bool) -> None:
        """A rewrite's answer (a recovery add is never refused as fenced)."""
        if self._first(att, "rewrite", entry, bid) and self.rec is not None:
            self._carry(self.rec.on_rewrite_response(entry, bid, ok))

    def _timeout(self, att: int, step: str, entry: int, replicas: tuple[int, ...]) -> None:
        for bid in replicas:
            if self.rec is None or self.rec.state in (rc.RecoveryState.DONE, rc.RecoveryState.ABORTED):
                return
            if not self._first(att, step, entry, bid):
                continue
            if step == "fence":
                self._carry(self.rec.on_fence_response(bid, rc.FenceOutcome.TIMEOUT))
            elif step == "read":
                self._carry(self.rec.on_read_response(entry, bid, rc.ReadOutcome.TIMEOUT))
            else:
                self._carry(self.rec.on_rewrite_response(entry, bid, False))
