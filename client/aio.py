"""The asyncio client: producer, consumer group member, single-queue reader and admin.

This is the one implementation; `tidelog.client.Client` runs it on a background event loop
for synchronous callers.

- Routes come from the controller and are cached per topic; any error that says the route may
  be stale (NOT_MASTER, unreachable broker, no master) refreshes it, and so does age.
- A send retries within a total time budget on answers that say "not here / not now"
  (NOT_MASTER, UNAVAILABLE, IN_SYNC_REPLICAS_NOT_ENOUGH, FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT)
  and gives up with SendFailedError naming the last cause. Answers about the request itself
  (invalid, too large, unknown topic after a refresh) are raised at once. A retried send whose
  first attempt timed out after the broker stored it can be delivered twice: at-least-once.
- Reads go to any replica of the queue's broker set (slaves first) and never see past its
  confirm offset; a failed replica is skipped for the next one.
- Lookups (`get_message`, `get_message_by_id`, `find_messages`) read confirmed messages from any
  replica: by position and id slaves first, moving on when one is unreachable or has not
  confirmed the message yet; by key the master first (its confirm offset leads) and every broker
  set of the topic, merged newest first.
- Channels are cached per address and reused; there is no thread per message.

`AsyncClient` is the entry point; each job lives in a module of its own, and every name is
importable from here as before: the transport (client/transport.py: channels, routes, calls to
masters and brokers), lookups (client/lookups.py), the producer (client/producer.py), the
single-queue reader (client/reader.py), the consumer group member (client/consumer.py) and the
admin (client/topicadmin.py, client/admin.py).
"""

from __future__ import annotations

from typing import Any

from tidelog.client import modes as md
from tidelog.client.admin import MAX_TOPICS_PER_CALL, AsyncAdmin
from tidelog.client.batching import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_IN_FLIGHT,
    BatchLimits,
)
from tidelog.client.consumer import AWAY_RETRY_S, AsyncConsumer, RebalanceListener
from tidelog.client.lookups import Lookups
from tidelog.client.producer import AsyncProducer
from tidelog.client.reader import READ_AHEAD, AsyncReader, ReadAhead
from tidelog.client.transport import ConsumedMessage, OutMessage, Receipt, Transport, reply_records

__all__ = [
    "AWAY_RETRY_S",
    "MAX_TOPICS_PER_CALL",
    "READ_AHEAD",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "ConsumedMessage",
    "OutMessage",
    "ReadAhead",
    "RebalanceListener",
    "Receipt",
    "Transport",
    "reply_records",
]


class AsyncClient(Lookups):
    """Entry point: `AsyncClient("host:port,host:port")`: controllers' or brokers' gRPC addresses
    (a broker answers route lookups itself and points at the controllers for the rest)."""

    # --- factories ---

    def producer(
        self,
        *,
        send_timeout: float | None = None,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> AsyncProducer:
        """A producer; concurrent sends are batched per queue (see client/batching.py for the options)."""
        return AsyncProducer(
            self,
            send_timeout or self.send_timeout,
            BatchLimits(linger_ms, batch_max_messages, batch_max_bytes, max_in_flight),
        )

    def consumer(self, group: str, topic: str, **kw: Any) -> AsyncConsumer:
        """A member of consumer group `group` reading `topic`; `mode` (client/modes.py) picks the
        subscription mode; `shared` and `key_shared` give an AsyncSharedConsumer (client/sharedconsumer.py)."""
        if kw.get("mode") in md.PER_MESSAGE:
            from tidelog.client.sharedconsumer import AsyncSharedConsumer  # it builds on AsyncConsumer

            return AsyncSharedConsumer(self, group, topic, **kw)
        return AsyncConsumer(self, group, topic, **kw)

    def reader(
        self, topic: str, queue: int, start_offset: int = 0, *, broker_set: str | None = None
    ) -> AsyncReader:
        return AsyncReader(self, topic, queue, start_offset, broker_set)

    def admin(self) -> AsyncAdmin:
        return AsyncAdmin(self)
