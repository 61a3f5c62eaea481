"""Shared subscriptions: which messages of a queue a receive hands out, and when one comes back
(pure; time passed in).

In the shared mode (client/modes.py) the members of a group do not own queues: any member receives
any message of any queue, and acknowledges each message on its own. Per (group, topic, queue) the
master keeps a `SharedQueue`:

- `floor`: every offset below it is finished (acknowledged, or moved to the dead-letter topic);
- `next`: the first offset never handed out. Every offset in [floor, next) is either *leased*
  (handed out and invisible to other receives until `visible_ms`, with its delivery count and the
  lease's sequence number) or *finished*;
- `seq`: the last lease sequence number given. A receipt names (offset, attempts, seq) and is
  honoured only while that lease is the offset's current one, so the receipt of a lease that
  expired and went to another member is stale, and a receipt nobody was given matches nothing.

A receive takes, oldest first, the leased messages whose invisible time is over, each delivered
once more, except a message already delivered `max_attempts` times, which is *dead* instead: the
shell copies it to the group's dead-letter topic and it is finished. Then it takes new offsets up
to the confirmed end, never more than `window` beyond the floor (which bounds the state, and the
record that stores it). `change_invisible` moves a lease's time (a nack is a change to 0: the next
receive hands the message out again) and gives a new receipt; `ack` finishes the offset.

The state is stored whole after every change, as one record of the reserved topic `%SHARED%`
(`encode`/`decode`; broker/shared.py), so it replicates with the log and a new master resumes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import InvalidArgumentError, ReceiptInvalidError

#: How far beyond the floor a receive may hand out new offsets (leased and finished together).
DEFAULT_WINDOW = 1000


@dataclass(frozen=True)
class Lease:
    visible_ms: int  # invisible to receives until this time (ms since the epoch)
    attempts: int  # deliveries so far, this one included
    seq: int  # the lease's sequence number: part of its receipt


@dataclass
class SharedQueue:
    floor: int
    next: int
    leases: dict[int, Lease] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)  # finished offsets in (floor, next)
    seq: int = 0

    def copy(self) -> SharedQueue:
        return SharedQueue(self.floor, self.next, dict(self.leases), set(self.finished), self.seq)


@dataclass(frozen=True)
class Delivery:
    offset: int
    attempts: int
    receipt: str


@dataclass(frozen=True)
class Received:
    deliveries: list[Delivery]
    dead: list[tuple[int, int]]  # (offset, attempts) to move to the dead-letter topic


def start(at: int) -> SharedQueue:
    """The state of a group that has not received from the queue yet, starting at offset `at`."""
    return SharedQueue(at, at)


def receipt(offset: int, lease: Lease) -> str:
    return f"{offset:x}.{lease.attempts:x}.{lease.seq:x}"


def parse_receipt(text: str) -> tuple[int, int, int]:
    """(offset, attempts, seq) of a receipt; InvalidArgument for anything that is not one."""
    parts = text.split(".") if isinstance(text, str) and len(text) <= 64 else []
    if len(parts) != 3 or not all(p and p.strip(_HEX) == "" for p in parts):
        raise InvalidArgumentError(
            f"{text!r} is not a receipt handle", hint="pass the receipt a receive gave"
        )
    return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)


_HEX = "0123456789abcdef"


def trim(st: SharedQueue, min_offset: int) -> None:
    """Offsets below `min_offset` are gone with retention: they count as finished."""
    if st.floor >= min_offset:
        return
    st.floor = min_offset
    st.next = max(st.next, min_offset)
    st.leases = {o: le for o, le in st.leases.items() if o >= min_offset}
    st.finished = {o for o in st.finished if o >= min_offset}
    _advance(st)


def deliverable(st: SharedQueue, now_ms: int, confirmed_end: int, window: int) -> bool:
    """Whether a receive now would hand something out (or move a dead message)."""
    if st.next < confirmed_end and st.next - st.floor < window:
        return True
    return any(le.visible_ms <= now_ms for le in st.leases.values())


def next_visible(st: SharedQueue) -> int | None:
    """When the earliest lease ends (None: nothing leased)."""
    return min((le.visible_ms for le in st.leases.values()), default=None)


def receive(
    st: SharedQueue,
    now_ms: int,
    confirmed_end: int,
    max_messages: int,
    invisible_ms: int,
    max_attempts: int,
    window: int = DEFAULT_WINDOW,
    dead_letters: bool = True,
) -> Received:
    """Hand out up to `max_messages`: expired leases first (oldest offset first), then new offsets
    below `confirmed_end`. Changes `st`. Without `dead_letters` (the dead-letter topic cannot take
    them yet) a message at `max_attempts` stays as it is, for a later receive to move."""
    out: list[Delivery] = []
    dead: list[tuple[int, int]] = []
    until = now_ms + invisible_ms
    for off in sorted(o for o, le in st.leases.items() if le.visible_ms <= now_ms):
        if len(out) >= max_messages:
            break
        attempts = st.leases[off].attempts
        if attempts >= max_attempts:
            if not dead_letters:
                continue
            dead.append((off, attempts))
            _finish(st, off)
            continue
        out.append(_lease(st, off, attempts + 1, until))
    while len(out) < max_messages and st.next < confirmed_end and st.next - st.floor < window:
        st.next += 1
        out.append(_lease(st, st.next - 1, 1, until))
    return Received(out, dead)


def ack(st: SharedQueue, text: str) -> int:
    """Finish the message of receipt `text`; returns its offset. Changes `st`."""
    off = _current(st, text)
    _finish(st, off)
    return off


def change_invisible(st: SharedQueue, text: str, now_ms: int, invisible_ms: int) -> Delivery:
    """The message of receipt `text` stays invisible until `now_ms + invisible_ms` (0: visible
    now, a nack); returns it with its new receipt (the old one is stale). Changes `st`."""
    off = _current(st, text)
    return _lease(st, off, st.leases[off].attempts, now_ms + invisible_ms)


def _current(st: SharedQueue, text: str) -> int:
    off, attempts, seq = parse_receipt(text)
    lease = st.leases.get(off)
    if lease is None or lease.seq != seq or lease.attempts != attempts:
        raise ReceiptInvalidError(
            f"receipt {text} is not the current lease of offset {off}",
            hint="its invisible time ran out and the message went out again (or it was never "
            "given): receive it again",
        )
    return off


def _lease(st: SharedQueue, off: int, attempts: int, visible_ms: int) -> Delivery:
    st.seq += 1
    lease = st.leases[off] = Lease(visible_ms, attempts, st.seq)
    return Delivery(off, attempts, receipt(off, lease))


def _finish(st: SharedQueue, off: int) -> None:
    st.leases.pop(off, None)
    st.finished.add(off)
    _advance(st)


def _advance(st: SharedQueue) -> None:
    while st.floor in st.finished:
        st.finished.discard(st.floor)
        st.floor += 1


def encode(st: SharedQueue) -> dict[str, Any]:
    """The JSON-ready form of a state (offsets relative to the floor, to keep the record small)."""
    f = st.floor
    return {
        "f": f,
        "n": st.next,
        "s": st.seq,
        "l": [[o - f, le.visible_ms, le.attempts, le.seq] for o, le in sorted(st.leases.items())],
        "d": sorted(o - f for o in st.finished),
    }


def decode(doc: Any) -> SharedQueue:
    """The state of `encode`'s form; ValueError for anything else."""
    try:
        f, n, s = int(doc["f"]), int(doc["n"]), int(doc["s"])
        leases = {f + int(o): Lease(int(v), int(a), int(q)) for o, v, a, q in doc["l"]}
        finished = {f + int(o) for o in doc["d"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a shared-subscription state: {exc}") from None
    st = SharedQueue(f, n, leases, finished, s)
    if not 0 <= f <= n or any(not f <= o < n for o in (*leases, *finished)) or leases.keys() & finished:
        raise ValueError("a shared-subscription state whose offsets are out of order")
    return st


def dumps(st: SharedQueue) -> str:
    return json.dumps(encode(st), separators=(",", ":"))
