"""Transactional RocketMQ messages: the state of the half messages of a broker set (pure; time
passed in).

A TRANSACTION message is stored as a *half* message in the internal topic `%HALF%` (queue 0),
where no consumer reads it. Its producer then ends it (EndTransaction): COMMIT copies it into its
topic, ROLLBACK drops it. A half message that nobody ends is *checked*: `check_interval_ms` after
it was stored, and again every `check_interval_ms`, the broker asks a producer of its topic
(Telemetry's RecoverOrphanedTransactionCommand), whose TransactionChecker answers with an
EndTransaction; after `max_checks` checks without an answer it is rolled back.

`TxState` is what the master keeps: every half offset below `next` has been seen, and each of
them is *open* (with its checks so far and the time of the next one) or *ended*: an offset in
[floor, next) that is not open is ended, so the state is as small as the open transactions.
`step(state, event, now, policy)` applies one event and returns what the shell must do; the
shell stores the state whole (`encode`) with what an action writes, in one write.

Invariants: an offset is delivered (`Deliver`) at most once and only for a COMMIT; an ended
offset is never delivered afterwards; a refused event changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Checks of one half message before it is rolled back (RocketMQ's `transactionCheckMax`).
DEFAULT_MAX_CHECKS = 15


@dataclass(frozen=True)
class Policy:
    check_interval_ms: int
    max_checks: int = DEFAULT_MAX_CHECKS


@dataclass(frozen=True)
class Open:
    checks: int  # checks sent so far
    next_check_ms: int  # when the next one is due


@dataclass
class TxState:
    floor: int = 0  # every half offset below it is ended
    next: int = 0  # every half offset below it has been seen
    open: dict[int, Open] = field(default_factory=dict)

    def copy(self) -> TxState:
        return TxState(self.floor, self.next, dict(self.open))


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    """The half message at `offset` (the next one) was stored at `stored_ms`."""

    offset: int
    stored_ms: int


@dataclass(frozen=True)
class End:
    """EndTransaction for the half message at `offset`."""

    offset: int
    commit: bool


@dataclass(frozen=True)
class Tick:
    """Time passes: checks fall due."""


Event = Added | End | Tick

# --- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deliver:
    """Copy the half message at `offset` into its topic (with the state, in one write)."""

    offset: int


@dataclass(frozen=True)
class Drop:
    """The half message at `offset` is rolled back: never delivered."""

    offset: int
    checked_out: bool  # rolled back by the broker after max_checks checks, not by an EndTransaction


@dataclass(frozen=True)
class Check:
    """Ask a producer of the message's topic how its transaction ended (the `attempt`th check)."""

    offset: int
    attempt: int


@dataclass(frozen=True)
class Refuse:
    """The event names no open transaction: nothing changes."""

    offset: int
    why: str  # "unknown" (never a half message here) or "ended"


Action = Deliver | Drop | Check | Refuse


def step(st: TxState, event: Event, now_ms: int, policy: Policy) -> list[Action]:
    """Apply `event` at `now_ms`; returns the actions, in order. Changes `st` (not on Refuse)."""
    if isinstance(event, Added):
        if event.offset != st.next:  # seen already (or not the next one): nothing new
            return []
        st.open[event.offset] = Open(0, event.stored_ms + policy.check_interval_ms)
        st.next += 1
        return []
    if isinstance(event, End):
        off = event.offset
        if off < 0 or off >= st.next:
            return [Refuse(off, "unknown")]
        if off not in st.open:
            return [Refuse(off, "ended")]
        _end(st, off)
        return [Deliver(off) if event.commit else Drop(off, checked_out=False)]
    out: list[Action] = []
    for off in sorted(o for o, tx in st.open.items() if tx.next_check_ms <= now_ms):
        tx = st.open[off]
        if tx.checks >= policy.max_checks:
            _end(st, off)
            out.append(Drop(off, checked_out=True))
        else:
            st.open[off] = Open(tx.checks + 1, now_ms + policy.check_interval_ms)
            out.append(Check(off, tx.checks + 1))
    return out


def _end(st: TxState, off: int) -> None:
    del st.open[off]
    st.floor = min(st.open, default=st.next)


def trim(st: TxState, min_offset: int) -> None:
    """Half messages below `min_offset` are gone with retention: nothing to end or check there."""
    st.open = {o: t for o, t in st.open.items() if o >= min_offset}
    st.next = max(st.next, min_offset)
    st.floor = min(st.open, default=st.next)


def next_check(st: TxState) -> int | None:
    """When the earliest check is due (None: no open transaction)."""
    return min((tx.next_check_ms for tx in st.open.values()), default=None)


def is_open(st: TxState, offset: int) -> bool:
    return offset in st.open


def encode(st: TxState) -> dict[str, Any]:
    return {
        "f": st.floor,
        "n": st.next,
        "o": [[off, tx.checks, tx.next_check_ms] for off, tx in sorted(st.open.items())],
    }


def decode(doc: Any) -> TxState:
    """The state of `encode`'s form; ValueError for anything else."""
    try:
        floor, nxt = int(doc["f"]), int(doc["n"])
        opened = {int(e[0]): Open(int(e[1]), int(e[2])) for e in doc["o"]}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"not a transaction state: {exc}") from None
    if not 0 <= floor <= nxt or any(not floor <= o < nxt for o in opened):
        raise ValueError("a transaction state whose offsets are out of order")
    if floor != min(opened, default=nxt):
        raise ValueError("a transaction state whose floor is not its first open offset")
    return TxState(floor, nxt, opened)
