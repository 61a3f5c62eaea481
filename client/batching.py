"""The producer's batching: concurrent sends gathered into one Produce request per queue.

Kafka's producer semantics, in small: every `send` joins the accumulator of its (topic, target)
— the queue its key maps to, or the topic's keyless sends, which the send path places round robin
— and gets its own future. An accumulator with no request in flight sends at once (a lone send
pays no linger); while `max_in_flight` requests are out, new sends wait and leave together as
the next batch, up to `batch_max_messages` and `batch_max_bytes`. `linger_ms` > 0 also holds the
first send of an idle accumulator that long, to trade latency for fuller batches.

Order: with `max_in_flight` 1 (the default) a queue has one request out at a time, and a batch is
retried whole (within the send budget) before the next leaves, so keyed messages keep their
per-key order under batching and retries. More in flight trades that order for throughput.

`take_batch` is the pure rule (which pending sends form the next request); `Accumulator` holds
one queue's pending sends. The I/O is the producer's (client/aio.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tidelog.errors import InvalidArgumentError

DEFAULT_LINGER_MS = 0
DEFAULT_BATCH_MAX_MESSAGES = 1000
DEFAULT_BATCH_MAX_BYTES = 4 << 20
DEFAULT_MAX_IN_FLIGHT = 1
KEYLESS_IN_FLIGHT = 2  # keyless sends keep no order, so up to this many of their requests overlap
# per-message overhead counted toward batch_max_bytes besides the body (key, tags, framing)
OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class BatchLimits:
    linger_ms: int = DEFAULT_LINGER_MS
    batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        for name, low, high in (
            ("linger_ms", 0, 60_000),
            ("batch_max_messages", 1, 100_000),
            ("batch_max_bytes", 1024, 48 << 20),
            ("max_in_flight", 1, 64),
        ):
            int_option(name, getattr(self, name), low, high)


def int_option(name: str, value: Any, low: int, high: int) -> int:
    """`value` of a client option that takes an integer in [low, high], else InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{low}, {high}], not {value!r}")
    return value


def message_bytes(item: Any) -> int:
    """What one outgoing message counts toward batch_max_bytes."""
    size = len(item.body) + OVERHEAD_BYTES
    if item.key:
        size += len(item.key)
    if item.tags:
        size += len(item.tags)
    if item.properties:
        size += sum(len(k) + len(v) for k, v in item.properties.items())
    return size


def take_batch(sizes: Sequence[int], max_messages: int, max_bytes: int) -> int:
    """How many of the pending sends (sizes, oldest first) the next request takes: at least one
    (a message alone over max_bytes goes alone, for the broker to judge), then as many as fit."""
    if not sizes:
        return 0
    n, total = 1, sizes[0]
    while n < len(sizes) and n < max_messages and total + sizes[n] <= max_bytes:
        total += sizes[n]
        n += 1
    return n


class Pending(NamedTuple):
    """One queued send (a tuple: one is made per message)."""

    item: Any
    size: int
    future: asyncio.Future[Any]


@dataclass
class Accumulator:
    topic: str
    target: tuple[str, int] | None
    pending: deque[Pending] = field(default_factory=deque)
    in_flight: int = 0
    lingering: bool = False

    def take(self, limits: BatchLimits) -> list[Pending]:
        n = take_batch([p.size for p in self.pending], limits.batch_max_messages, limits.batch_max_bytes)
        return [self.pending.popleft() for _ in range(n)]


#: send_batch: keyless messages travel in up to this many concurrent requests, each of at least
#: KEYLESS_PIECE_MIN messages. While one request is being replicated, the next is being checked
#: and appended: a lone 1,000-message request leaves the broker idle for most of its round trip.
KEYLESS_PIECES = 4
KEYLESS_PIECE_MIN = 200


def split_keyless(indexes: list[int]) -> list[list[int]]:
    """The pieces one send_batch's keyless messages go in (none for no messages)."""
    if not indexes:
        return []
    pieces = max(1, min(KEYLESS_PIECES, len(indexes) // KEYLESS_PIECE_MIN))
    size = -(-len(indexes) // pieces)
    return [indexes[i : i + size] for i in range(0, len(indexes), size)]
