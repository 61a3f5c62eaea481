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

*Key order* (the key_shared mode): the shell passes the key (a hash of it) of each new offset it
may hand out. A key's messages then go out one at a time, in offset order: a message whose key
has a message leased (to anyone, invisible or not: an expired lease goes out again first) is
*skipped*, remembered with its key, and handed out, before any later message of its key, once
that key is free. Every offset in [floor, next) is then leased, finished or skipped. Keyless
messages are not held back.

The state is stored whole after every change, as one record of the reserved topic `%SHARED%`
(`encode`/`decode`; broker/shared.py), so it replicates with the log and a new master resumes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    key: int | None = None  # key order: the message's key (hash); None: keyless or no key order


@dataclass
class SharedQueue:
    floor: int
    next: int
    leases: dict[int, Lease] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)  # finished offsets in (floor, next)
    seq: int = 0
    skipped: dict[int, int] = field(default_factory=dict)  # key order: offset -> key, held back

    def copy(self) -> SharedQueue:
        return SharedQueue(
            self.floor, self.next, dict(self.leases), set(self.finished), self.seq, dict(self.skipped)
        )


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
    st.skipped = {o: k for o, k in st.skipped.items() if o >= min_offset}
    _advance(st)


def deliverable(st: SharedQueue, now_ms: int, confirmed_end: int, window: int) -> bool:
    """Whether a receive now would hand something out (or move a dead message)."""
    if st.next < confirmed_end and st.next - st.floor < window:
        return True
    if any(le.visible_ms <= now_ms for le in st.leases.values()):
        return True
    busy = _busy_keys(st)
    return any(k not in busy for k in st.skipped.values())


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
    keys: Mapping[int, int | None] | None = None,
) -> Received:
    """Hand out up to `max_messages`: expired leases first (oldest offset first), then new offsets
    below `confirmed_end`. Changes `st`. Without `dead_letters` (the dead-letter topic cannot take
    them yet) a message at `max_attempts` stays as it is, for a later receive to move.

    `keys` (key order): the key of each new offset the shell looked at, from `st.next` on; new
    offsets go out only as far as it reaches, and skipped ones first when their key is free."""
    out: list[Delivery] = []
    until = now_ms + invisible_ms
    dead = _redeliver(st, now_ms, until, max_messages, max_attempts, dead_letters, out)
    busy = _busy_keys(st)
    for off in sorted(st.skipped):
        held = st.skipped[off]
        if len(out) < max_messages and held not in busy:
            del st.skipped[off]
            busy.add(held)
            out.append(_lease(st, off, 1, until, held))
    while len(out) < max_messages and st.next < confirmed_end and st.next - st.floor < window:
        off = st.next
        if keys is not None and off not in keys:
            break
        key = None if keys is None else keys[off]
        st.next += 1
        if key is not None and key in busy:
            st.skipped[off] = key
            continue
        if key is not None:
            busy.add(key)
        out.append(_lease(st, off, 1, until, key))
    return Received(out, dead)


def _redeliver(
    st: SharedQueue,
    now_ms: int,
    until: int,
    max_messages: int,
    max_attempts: int,
    dead_letters: bool,
    out: list[Delivery],
) -> list[tuple[int, int]]:
    """Lease the expired leases again into `out` (oldest first); returns the dead ones, finished."""
    dead: list[tuple[int, int]] = []
    for off in sorted(o for o, le in st.leases.items() if le.visible_ms <= now_ms):
        if len(out) >= max_messages:
            break
        lease = st.leases[off]
        if lease.attempts >= max_attempts:
            if dead_letters:
                dead.append((off, lease.attempts))
                _finish(st, off)
            continue
        out.append(_lease(st, off, lease.attempts + 1, until, lease.key))
    return dead


def _busy_keys(st: SharedQueue) -> set[int]:
    """The keys with a message leased: their next message waits."""
    return {le.key for le in st.leases.values() if le.key is not None}


def ack(st: SharedQueue, text: str) -> int:
    """Finish the message of receipt `text`; returns its offset. Changes `st`."""
    off = _current(st, text)
    _finish(st, off)
    return off


def change_invisible(st: SharedQueue, text: str, now_ms: int, invisible_ms: int) -> Delivery:
    """The message of receipt `text` stays invisible until `now_ms + invisible_ms` (0: visible
    now, a nack); returns it with its new receipt (the old one is stale). Changes `st`."""
    off = _current(st, text)
    lease = st.leases[off]
    return _lease(st, off, lease.attempts, now_ms + invisible_ms, lease.key)


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


def _lease(st: SharedQueue, off: int, attempts: int, visible_ms: int, key: int | None = None) -> Delivery:
    st.seq += 1
    lease = st.leases[off] = Lease(visible_ms, attempts, st.seq, key)
    return Delivery(off, attempts, receipt(off, lease))


def finish(st: SharedQueue, off: int) -> None:
    """Finish a leased offset (an acknowledgement read back from the log); others are left as
    they are (an acknowledgement can only name a leased offset)."""
    if off in st.leases:
        _finish(st, off)


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
        "l": [
            [o - f, le.visible_ms, le.attempts, le.seq, *([] if le.key is None else [le.key])]
            for o, le in sorted(st.leases.items())
        ],
        "d": sorted(o - f for o in st.finished),
        **({"k": [[o - f, k] for o, k in sorted(st.skipped.items())]} if st.skipped else {}),
    }


def decode(doc: Any) -> SharedQueue:
    """The state of `encode`'s form; ValueError for anything else."""
    try:
        f, n, s = int(doc["f"]), int(doc["n"]), int(doc["s"])
        leases = {f + int(e[0]): _lease_of(e) for e in doc["l"]}
        finished = {f + int(o) for o in doc["d"]}
        skipped = {f + int(o): int(k) for o, k in doc.get("k", [])}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"not a shared-subscription state: {exc}") from None
    st = SharedQueue(f, n, leases, finished, s, skipped)
    parts = (set(leases), finished, set(skipped))
    if (
        not 0 <= f <= n
        or any(not f <= o < n for part in parts for o in part)
        or sum(map(len, parts)) != len(set().union(*parts))
    ):
        raise ValueError("a shared-subscription state whose offsets are out of order")
    return st


def _lease_of(entry: Any) -> Lease:
    if not 4 <= len(entry) <= 5:
        raise ValueError(f"a lease has 4 or 5 fields, not {len(entry)}")
    return Lease(int(entry[1]), int(entry[2]), int(entry[3]), int(entry[4]) if len(entry) == 5 else None)


def dumps(st: SharedQueue) -> str:
    return json.dumps(encode(st), separators=(",", ":"))
