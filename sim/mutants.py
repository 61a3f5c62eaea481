"""Deliberate bugs, applied in-process to the real code (never to its files), that the simulator must catch.

Each mutant replaces one real function or method with a buggy variant (monkeypatching: the
module attribute or class attribute the callers look up) and, where the bug is the broker shell's,
flips a shell switch. `run_all` runs every mutant in a fresh worker process over seeds until
one fails, and prints seeds-to-catch per mutant and their median.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    apply: Callable[[], None]
    # The newer guard that stops this bug from doing harm, when one does: an equivalent mutant
    # under today's code (no schedule can make it break a promise), still searched, reported
    # apart, and its own rule kept by table tests.
    masked_by: str = ""


def _confirm_fastest() -> None:
    from tidelog.ha import ackpolicy

    def confirm_offset(
        master_id: int, master_offset: int, acks: Any, connected: Any, sss: Any, current: int
    ) -> int:
        others = [min(acks.get(m, 0), master_offset) for m in sss if m != master_id]
        return max(current, max(others, default=master_offset))

    ackpolicy.confirm_offset = confirm_offset


def _late_refusal() -> None:
    from tidelog.ha import mastercore
    from tidelog.ha.mastercore import AlterFailed, MasterCore

    real = MasterCore._membership  # noqa: SLF001 - the mutant replaces it

    def membership(self: MasterCore, event: Any, now_ms: int) -> Any:
        if isinstance(event, AlterFailed):
            self.tracker.on_alter_failed()  # no check that it is still the pending proposal
            return None
        return real(self, event, now_ms)

    setattr(mastercore.MasterCore, "_membership", membership)  # noqa: B010
    # As the bug was found: with the shell of before, which gave an unanswered proposal up after a
    # timeout; that late AlterFailed may meet a newer pending proposal (the shell of now retries,
    # and only a late definite refusal can).
    from . import broker

    broker.SHELL["give_up_unanswered"] = True


def _give_up_unanswered() -> None:
    from . import broker

    broker.SHELL["give_up_unanswered"] = True


def _no_epoch_check() -> None:
    from tidelog.ha import slavecore

    def lcp(local: Any, local_end: Any, remote: Any, remote_end: Any) -> int:
        return int(min(local_end, remote_end))

    slavecore.last_consistent_point = lcp


def _elect_outside() -> None:
    from tidelog.controller import election, mastership

    real = election.elect

    def elect(
        sss: Any, members: Any, old: Any, preferred: Any, alive: Any, enable_unclean: bool
    ) -> int | None:
        winner: int | None = real(members, members, old, preferred, alive, enable_unclean)
        return winner

    mastership.choose_master = elect


def _ack_before_append() -> None:
    from tidelog.ha import slavecore
    from tidelog.ha.slavecore import Ack, SlaveCore

    real = SlaveCore._transfer  # noqa: SLF001 - the mutant replaces it

    def transfer(self: SlaveCore, ev: Any) -> Any:
        actions = real(self, ev)
        acks = [a for a in actions if isinstance(a, Ack)]
        return acks + [a for a in actions if not isinstance(a, Ack)]

    setattr(slavecore.SlaveCore, "_transfer", transfer)  # noqa: B010


def _lease_only_before() -> None:
    from tidelog.ha import lease

    lease.Lease.may_acknowledge = lambda self, now_ms, epoch, end, held, *, replication: True


def _expansion_after_confirm() -> None:
    from tidelog.ha import ackpolicy, mastercore

    from . import broker

    def held_by_all(self: mastercore.MasterCore) -> int:
        return int(
            ackpolicy.held_by_all(
                self.broker_id, self.master_max, self.acks(), set(self.slaves), self.tracker.local
            )
        )

    mastercore.MasterCore.held_by_all = held_by_all
    broker.SHELL["give_up_unanswered"] = True


def _acks_from_outside() -> None:
    from tidelog.ha import mastercore
    from tidelog.ha.mastercore import MasterCore

    def acked_by(self: MasterCore, needed: int) -> int:
        offsets = sorted([self.master_max, *self.acks().values()], reverse=True)
        return offsets[needed - 1] if needed <= len(offsets) else 0

    mastercore.MasterCore.acked_by = acked_by


def _no_stale_check() -> None:
    from tidelog.ha import roles

    real = roles.classify

    def classify(*, role: str, known_epoch: int, leading: Any, following: Any, event: Any) -> Any:
        return real(role=role, known_epoch=0, leading=leading, following=following, event=event)

    roles.classify = classify


def _no_sss_epoch_fence() -> None:
    from tidelog.controller import mastership

    real = mastership._check_fencing  # noqa: SLF001 - the mutant replaces it

    def check(bs: Any, c: Any, new_set: Any, snap: Any) -> None:
        real(bs, type(c)(**{**c.__dict__, "sss_epoch": bs.sss_epoch}), new_set, snap)

    setattr(mastership, "_check_fencing", check)  # noqa: B010


def _no_witness() -> None:
    from tidelog.controller import liveness

    liveness.HeartbeatTable.in_grace = lambda self, now_ms: False
    liveness.HeartbeatTable.is_alive = lambda self, s, b, now_ms: (
        (e := self._entries.get((s, b))) is not None and e.last_seen_ms + self.timeout_ms // 3 >= now_ms
    )


def _slave_confirm_unclamped() -> None:
    from tidelog.ha import slavecore
    from tidelog.ha.slavecore import SetConfirm, SlaveCore

    real = SlaveCore._transfer  # noqa: SLF001 - the mutant replaces it

    def transfer(self: SlaveCore, ev: Any) -> Any:
        actions = [a for a in real(self, ev) if not isinstance(a, SetConfirm)]
        if ev.confirm_offset > ev.local.confirm_offset:
            actions.append(SetConfirm(ev.confirm_offset))
        return actions

    setattr(slavecore.SlaveCore, "_transfer", transfer)  # noqa: B010


def _shrink_on_same_epoch() -> None:
    from tidelog.ha import syncstate

    real = syncstate.SyncStateTracker.on_controller_state

    def on_state(self: Any, sss: Any, sss_epoch: int, *, now_ms: int | None = None) -> bool:
        # a same-epoch state ends the pending proposal (it may still be applied)
        if sss_epoch == self.sss_epoch and self.pending is not None:
            self.on_alter_failed()
        return bool(real(self, sss, sss_epoch, now_ms=now_ms))

    syncstate.SyncStateTracker.on_controller_state = on_state


def _no_lease_fence() -> None:
    from tidelog.ha import lease

    lease.LeaseFences.withholds = lambda self, broker_set, master_epoch: False


def _unvouched_promotion() -> None:
    from tidelog.ha import roles

    real = roles.classify

    def classify(**kw: Any) -> roles.Kind:
        ev = kw["event"]
        kw["event"] = roles.Assigned(ev.role, ev.last_epoch, ev.broker_id, True)
        return real(**kw)

    roles.classify = classify


def _alter_attempts_unnumbered() -> None:
    import dataclasses

    from tidelog.controller import commands, mastership, state

    real = mastership.alter

    def alter(s: Any, c: Any) -> Any:
        return real(s, dataclasses.replace(c, attempt=0))

    state.HANDLERS[commands.AlterSyncStateSet] = alter


def _ledger_first_negative() -> None:
    from tidelog.ledger import recovery

    recovery.negative_quorum = lambda write_quorum, ack_quorum: 1


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "confirm-fastest",
            "the confirm offset from the fastest ack, not the slowest member",
            _confirm_fastest,
        ),
        Mutant(
            "late-refusal",
            "an AlterFailed for an overtaken proposal clears the pending one (with the shell of before)",
            _late_refusal,
        ),
        Mutant(
            "give-up-unanswered",
            "the shell gives an unanswered proposal up after three heartbeats (the cores correct)",
            _give_up_unanswered,
        ),
        Mutant(
            "truncate-no-epoch-check", "fork repair cuts at the shorter end, ignoring epochs", _no_epoch_check
        ),
        Mutant(
            "elect-outside-sss",
            "an election outside the SyncStateSet with unclean elections off",
            _elect_outside,
        ),
        Mutant(
            "ack-before-append",
            "a slave acks a transfer before it appends and flushes it",
            _ack_before_append,
        ),
        Mutant("lease-only-before", "the lease checked only before the append", _lease_only_before),
        Mutant(
            "expansion-after-confirm",
            "held_by_all over the confirmed set only, and an unanswered proposal given up",
            _expansion_after_confirm,
        ),
        Mutant("acks-from-outside", "acks of slaves outside the SyncStateSet count", _acks_from_outside),
        Mutant(
            "role-no-stale-check",
            "a reply of an older master epoch is acted on",
            _no_stale_check,
        ),
        Mutant(
            "alter-no-sss-epoch-fence",
            "the controller applies a proposal from an older set epoch",
            _no_sss_epoch_fence,
            masked_by="a late copy of an older set epoch is an older attempt, which RULES.md A4b "
            "refuses (tests/controller/test_state_rules.py)",
        ),
        Mutant(
            "liveness-no-grace",
            "a new leader fails masters over without witnessed silence, at a third of the timeout",
            _no_witness,
        ),
        Mutant(
            "slave-confirm-unclamped",
            "a slave's confirm offset follows the master's past its own end",
            _slave_confirm_unclamped,
        ),
        Mutant(
            "no-lease-fence",
            "a leader renews the lease of a master it is electing a replacement for (RULES.md L7)",
            _no_lease_fence,
        ),
        Mutant(
            "unvouched-promotion",
            "a broker takes mastership from a heartbeat reply that renews no lease (a stale leader's)",
            _unvouched_promotion,
            masked_by="a lease holds for the epoch it was granted for only, and only an answer "
            "naming the broker master renews it (ha/lease.py; tests/ha/test_lease.py)",
        ),
        Mutant(
            "alter-attempts-unnumbered",
            "the controller applies a late copy of an attempt older than one it answered (RULES.md A4b)",
            _alter_attempts_unnumbered,
        ),
        Mutant(
            "ledger-first-negative",
            "ledger recovery ends at the first replica that answers no such entry",
            _ledger_first_negative,
        ),
        Mutant(
            "same-epoch-ends-pending",
            "a same-epoch controller state ends a pending proposal",
            _shrink_on_same_epoch,
        ),
    )
}


def run_all(max_seeds: int, start: int, n_faults: int, workers: int | None) -> int:
    """Each mutant over seeds start.. until one fails; a line per mutant, then a JSON summary."""
    from .run import batch
    from .world import run_seed

    caught: dict[str, int | None] = {}
    step = 100
    for name, m in MUTANTS.items():
        found = None
        s = start
        while found is None and s < start + max_seeds:
            n = min(step, start + max_seeds - s)
            res = batch(s, n, n_faults=n_faults, workers=workers, mutant=name, stop_at_first=True)
            failures = res["_failures"]
            for seed, why in failures:
                # a catch counts only where the real code passes the same seed
                if run_seed(seed, n_faults=n_faults).ok:
                    found = seed - start + 1
                    print(f"{name:26s} caught after {found:5d} seeds (seed {seed}): {why[:150]}", flush=True)
                    break
            # the unmutated code fails there too: search on after the first such seed
            s = failures[0][0] + 1 if failures and found is None else s + n
        if found is None:
            why = f"; masked: {m.masked_by}" if m.masked_by else ""
            print(f"{name:26s} NOT caught in {max_seeds} seeds ({m.what}){why}", flush=True)
        caught[name] = found
    counts = [c for c in caught.values() if c is not None]
    masked = sorted(n for n, c in caught.items() if c is None and MUTANTS[n].masked_by)
    summary = {
        "mutants": len(caught),
        "caught": len(counts),
        "masked": masked,  # not caught, and equivalent under a newer guard (`Mutant.masked_by`)
        "median_seeds_to_catch": statistics.median(counts) if counts else None,
        "seeds_to_catch": caught,
    }
    print(json.dumps(summary))
    return 0 if len(counts) + len(masked) == len(caught) else 1
