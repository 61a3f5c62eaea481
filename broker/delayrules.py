"""Delayed RocketMQ messages (type DELAY, `delivery_timestamp`): when one may be delivered, which
queue of the internal topic `%DELAY%` keeps it until then, and which kept messages are due (pure;
time passed in).

A delayed message is stored at once in `%DELAY%` of its broker set, queue `bucket(delay)`, and
moved into its real topic by the master once due (broker/rocketmqtx.py). Bucket b holds delays
in (2^(b-1), 2^b] seconds (bucket 0: at most one second), so the messages of one bucket are due
within a factor of two of each other: a long delay never sits in front of a short one. The mover
looks at most `WINDOW` messages beyond a bucket's floor, so a bucket whose first message is not
due yet delays the later ones of that bucket only when WINDOW of them wait behind it, and then by
at most their own delay again.

Per bucket the mover's progress is a `Progress`: every offset below `floor` is moved, and `done`
the moved offsets above it. It is stored whole (`encode`) after every move, with the copies, so a
new master resumes from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The longest delay served (RocketMQ's default timer bound, `timerMaxDelaySec`: 40 days).
MAX_DELAY_MS = 40 * 24 * 3600 * 1000
#: Queues of `%DELAY%`: enough buckets for MAX_DELAY_MS (2^22 s is about 48 days).
BUCKETS = 23
#: How many messages beyond a bucket's floor the mover looks at.
WINDOW = 1000


class DeliveryTimeError(ValueError):
    """A delivery time that is not served (RocketMQ's ILLEGAL_DELIVERY_TIME)."""


def delay_ms(deliver_at_ms: int, now_ms: int, max_delay_ms: int = MAX_DELAY_MS) -> int:
    """How long a message to be delivered at `deliver_at_ms` waits from `now_ms` (0: a time
    already past, delivered at once); DeliveryTimeError beyond `max_delay_ms`."""
    if deliver_at_ms <= 0:
        raise DeliveryTimeError("a DELAY message needs a delivery timestamp")
    wait = deliver_at_ms - now_ms
    if wait > max_delay_ms:
        raise DeliveryTimeError(
            f"the delivery time is {wait // 1000} s ahead: at most {max_delay_ms // 1000} s is served"
        )
    return max(0, wait)


def bucket(delay: int) -> int:
    """The `%DELAY%` queue of a message waiting `delay` ms: (2^(b-1), 2^b] seconds -> b."""
    seconds = -(-delay // 1000)  # rounded up
    if seconds <= 1:
        return 0
    return min(BUCKETS - 1, (seconds - 1).bit_length())


@dataclass
class Progress:
    """The mover's progress in one bucket: offsets below `floor` are moved, and `done` above it."""

    floor: int = 0
    done: set[int] = field(default_factory=set)

    def copy(self) -> Progress:
        return Progress(self.floor, set(self.done))


def scan_range(p: Progress, min_offset: int, end: int) -> tuple[int, int]:
    """The offsets [first, last) of the bucket the mover looks at (up to `end`, the confirmed end)."""
    first = max(p.floor, min_offset)
    return first, min(end, first + WINDOW)


def due(p: Progress, kept: Sequence[tuple[int, int]], now_ms: int) -> list[int]:
    """The offsets of `kept` ((offset, delivery time ms) of the bucket's messages) that are due at
    `now_ms` and not moved yet, in offset order."""
    return sorted(off for off, at in kept if at <= now_ms and off >= p.floor and off not in p.done)


def next_due(p: Progress, kept: Sequence[tuple[int, int]]) -> int | None:
    """When the first of `kept` not moved yet is due (None: every one is moved)."""
    return min((at for off, at in kept if off >= p.floor and off not in p.done), default=None)


def mark(p: Progress, moved: Iterable[int]) -> None:
    """Offsets `moved` are in their topic now. Changes `p`."""
    p.done.update(off for off in moved if off >= p.floor)
    while p.floor in p.done:
        p.done.discard(p.floor)
        p.floor += 1


def trim(p: Progress, min_offset: int) -> None:
    """Offsets below `min_offset` are gone with retention: nothing there to move."""
    if p.floor < min_offset:
        p.floor = min_offset
        p.done = {o for o in p.done if o >= min_offset}
        mark(p, ())


def encode(p: Progress) -> dict[str, Any]:
    return {"f": p.floor, "d": sorted(o - p.floor for o in p.done)}


def decode(doc: Any) -> Progress:
    """The progress of `encode`'s form; ValueError for anything else."""
    try:
        floor = int(doc["f"])
        done = {floor + int(o) for o in doc["d"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a delay progress: {exc}") from None
    if floor < 0 or floor in done or any(o < floor for o in done):
        raise ValueError("a delay progress whose offsets are out of order")
    return Progress(floor, done)
