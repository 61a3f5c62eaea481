"""What an operator's change to a consumer group's offsets does, decided before anything is written (pure).

`tide group reset-offsets` moves the group's committed offsets of some queues of a topic to the
earliest or latest (confirmed) offset, to the first offset stored at or after a time, or to an
offset. Everything is checked first, on every queue selected, and the whole reset is refused
if any queue would land outside [min, confirmed]: the shell then writes nothing. The per-member
summary of `tide group describe` (`member_lag`) is computed here too.

The I/O (queue offsets, the brokers' time search, the commits, the owner keys) is
client/groupadmin.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidArgumentError, ResetOffsetOutOfRangeError

Queue = tuple[str, int]  # (broker set, queue)

EARLIEST, LATEST, TIMESTAMP, OFFSET = "earliest", "latest", "timestamp", "offset"
TARGETS = (EARLIEST, LATEST, TIMESTAMP, OFFSET)


@dataclass(frozen=True)
class Target:
    """Where a reset puts each queue: `to` is one of TARGETS; `offset` or `timestamp_ms` with it."""

    to: str
    offset: int | None = None
    timestamp_ms: int | None = None


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds from `text`: an integer (epoch ms) or ISO-8601 (a time without a UTC
    offset is taken as UTC, so that the answer does not depend on where the command runs)."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        ms = int(raw)
    else:
        try:
            when = dt.datetime.fromisoformat(raw)
        except ValueError:
            raise InvalidArgumentError(
                f"cannot read {text!r} as a time",
                hint="give epoch milliseconds (1717171717000) or ISO-8601 (2024-05-31T16:08:37Z, "
                "2024-05-31T18:08:37+02:00; without an offset: UTC)",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise InvalidArgumentError(f"the time {text!r} is before 1970", hint="give a time after 1970-01-01")
    return ms


def target(to: str, offset: int | None = None, timestamp: str | None = None) -> Target:
    """The reset target of the command's options, checked: `--to offset` needs `--offset N`
    (N >= 0), `--to timestamp` needs `--timestamp T`, and neither comes with another target."""
    if to not in TARGETS:
        raise InvalidArgumentError(f"unknown reset target {to!r}", hint=f"use one of {', '.join(TARGETS)}")
    if (offset is not None) != (to == OFFSET):
        raise InvalidArgumentError("--offset N goes with --to offset, and only with it")
    if (timestamp is not None) != (to == TIMESTAMP):
        raise InvalidArgumentError("--timestamp T goes with --to timestamp, and only with it")
    if offset is not None and offset < 0:
        raise ResetOffsetOutOfRangeError(f"offset {offset} is negative: queue offsets start at 0")
    return Target(to, offset, None if timestamp is None else parse_timestamp(timestamp))


def select_queues(queues: Sequence[Queue], queue: int | None, broker_sets: Sequence[str]) -> list[Queue]:
    """The queues of the topic's route (`queues`) a reset touches: those of `broker_sets` (all if
    empty) and with id `queue` (all if None). Naming one the topic does not have is an error."""
    sets = {bs for bs, _ in queues}
    unknown = sorted(set(broker_sets) - sets)
    if unknown:
        raise InvalidArgumentError(
            f"the topic has no queues in broker set(s) {', '.join(unknown)}",
            hint=f"its broker sets are {', '.join(sorted(sets)) or 'none'}",
        )
    chosen = [
        q for q in queues if (not broker_sets or q[0] in broker_sets) and (queue is None or q[1] == queue)
    ]
    if not chosen:
        raise InvalidArgumentError(
            f"the topic has no queue {queue} in the broker sets selected",
            hint="see its queues with `tide topic describe TOPIC`",
        )
    return sorted(chosen)


@dataclass(frozen=True)
class QueueState:
    """What the shell read of one queue: its offsets, the group's commit, and for a timestamp
    target the broker's answer (`at_time`: the first offset stored at or after it)."""

    queue: Queue
    min: int
    confirmed: int
    committed: int | None
    at_time: int | None = None


@dataclass(frozen=True)
class Planned:
    """One queue of a reset: the group's commit before (None: none) and the offset it gets."""

    queue: Queue
    before: int | None
    after: int


def _after(t: Target, s: QueueState) -> int:
    if t.to == EARLIEST:
        return s.min
    if t.to == LATEST:
        return s.confirmed
    found = t.offset if t.to == OFFSET else s.at_time
    if found is None:
        raise InvalidArgumentError(f"no offset was found for queue {s.queue[0]}/{s.queue[1]}")
    return found


def plan_reset(t: Target, states: Iterable[QueueState]) -> list[Planned]:
    """The offset each queue gets, sorted by queue; ResetOffsetOutOfRangeError naming every queue
    that would land outside [min, confirmed] (then nothing may be written)."""
    plan = sorted((Planned(s.queue, s.committed, _after(t, s)) for s in states), key=lambda p: p.queue)
    ranges = {s.queue: (s.min, s.confirmed) for s in states}
    bad = [p for p in plan if not ranges[p.queue][0] <= p.after <= ranges[p.queue][1]]
    if bad:
        where = "; ".join(
            f"{p.queue[0]}/{p.queue[1]} holds {ranges[p.queue][0]}..{ranges[p.queue][1]}" for p in bad
        )
        raise ResetOffsetOutOfRangeError(
            f"offset {bad[0].after} is outside {len(bad)} queue(s): {where}; nothing was changed",
            queues=[f"{p.queue[0]}/{p.queue[1]}" for p in bad],
        )
    return plan


def member_lag(rows: Iterable[Mapping[str, Any]], live: Iterable[str]) -> list[dict[str, Any]]:
    """Per member: the queues whose owner key it holds ("broker set/queue"), their total lag,
    and whether its session is live (a holder that is not live is about to be taken over).
    `rows` are `group_lag`'s per-queue rows; live members holding no queue are listed too."""
    live_set = set(live)
    held: dict[str, list[Mapping[str, Any]]] = {m: [] for m in live_set}
    for row in rows:
        if row.get("owner"):
            held.setdefault(str(row["owner"]), []).append(row)
    return [
        {
            "member": m,
            "queues": [f"{r['broker_set']}/{r['queue']}" for r in sorted(held[m], key=_queue_of)],
            "lag": sum(int(r["lag"]) for r in held[m]),
            "live": m in live_set,
        }
        for m in sorted(held)
    ]


def _queue_of(row: Mapping[str, Any]) -> tuple[str, int]:
    return str(row["broker_set"]), int(row["queue"])
