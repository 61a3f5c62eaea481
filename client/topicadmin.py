"""Topics and broker sets, through the controllers: the half of the admin API that needs only
the transport (client/transport.py), which is how the broker's RocketMQ endpoint creates its
dead-letter topics with it. `AsyncAdmin` (client/admin.py) adds consumer groups on top."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from tidelog.client import assign as asg
from tidelog.client.transport import Transport
from tidelog.errors import (
    TidelogError,
    TopicGenerationPendingError,
    TopicNotFoundError,
    UnavailableError,
    by_code,
)
from tidelog.proto import controller_pb2 as cpb

log = logging.getLogger(__name__)

#: Topics per CreateTopics call (the controller takes up to 1,000 in one Raft commit).
MAX_TOPICS_PER_CALL = 1000
#: How long a topic the controllers' route names may still be unknown to its brokers: they learn
#: it from their next heartbeat's answer (every second by default), a few of them at most.
TOPIC_PROPAGATION_S = 5.0


class TopicAdmin:
    def __init__(self, client: Transport) -> None:
        self.client = client

    async def broker_sets(self) -> list[str]:
        reply = await self.client.controller.describe_broker_sets()
        return sorted(b.role.broker_set for b in reply.broker_sets)

    async def create_topic(
        self,
        name: str,
        queues: int = 4,
        broker_sets: Iterable[str] | None = None,
        perm: str = "rw",
        retention_ms: int = 0,
    ) -> dict[str, int]:
        """`retention_ms`: how long its messages stay readable (0: the brokers' retention_ms)."""
        sets = list(broker_sets) if broker_sets else await self.broker_sets()
        if not sets:
            raise UnavailableError("no broker set is registered yet", hint="start the brokers first")
        cfg = await self.client.controller.create_topic(name, {s: queues for s in sets}, perm, retention_ms)
        self.client.forget_route(name)
        return dict(cfg.queues)

    async def create_topics(
        self,
        names: Iterable[str],
        queues: int = 4,
        broker_sets: Iterable[str] | None = None,
        perm: str = "rw",
        retention_ms: int = 0,
    ) -> dict[str, TidelogError | None]:
        """Create many topics alike, up to 1,000 per controller call (one Raft commit each call);
        returns each name's outcome: None when created, else its typed error (TOPIC_EXISTS, ...)."""
        sets = list(broker_sets) if broker_sets else await self.broker_sets()
        if not sets:
            raise UnavailableError("no broker set is registered yet", hint="start the brokers first")
        queue_map = {s: queues for s in sets}
        names = list(names)
        out: dict[str, TidelogError | None] = {}
        for start in range(0, len(names), MAX_TOPICS_PER_CALL):
            requests = [
                cpb.CreateTopicRequest(name=n, queues=queue_map, perm=perm, retention_ms=retention_ms)
                for n in names[start : start + MAX_TOPICS_PER_CALL]
            ]
            for result in await self.client.controller.create_topics(requests):
                out[result.name] = (
                    by_code(result.error_code)(result.error_message) if result.error_code else None
                )
                self.client.forget_route(result.name)
        return out

    async def delete_topic(self, name: str) -> None:
        await self.client.controller.delete_topic(name)
        self.client.forget_route(name)

    async def alter_topic_queues(
        self, name: str, queues: int, broker_sets: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Grow topic `name` to `queues` queues in each of its broker sets (or the named ones)."""
        sets = (
            list(broker_sets)
            if broker_sets
            else sorted(b.name for b in (await self.client.route(name, refresh=True)).broker_sets)
        )
        cfg = await self.client.controller.alter_topic_queues(name, {s: queues for s in sets})
        self.client.forget_route(name)
        return dict(cfg.queues)

    async def alter_topic_retention(self, name: str, retention_ms: int) -> int:
        """Set how long topic `name`'s messages stay readable (0: the brokers' retention_ms);
        returns the retention now stored."""
        cfg = await self.client.controller.alter_topic_retention(name, retention_ms)
        return int(cfg.retention_ms)

    async def topic_retention(self, name: str) -> int:
        """Topic `name`'s own retention in ms (0: the brokers'); TopicNotFoundError if none."""
        page, _ = await self.client.controller.list_topics_page(prefix=name, limit=1)
        for t in page:
            if t.name == name:
                return int(t.retention_ms)
        raise TopicNotFoundError(f"no topic {name!r}", hint="list them with `tide topic list`")

    async def topic_readers(self, name: str, within_ms: int) -> list[str]:
        """Consumer groups with a member that announced reading topic `name` within the last
        `within_ms` milliseconds (members announce every few seconds while they poll)."""
        entries = await self.client.controller.meta_list("group/")
        return asg.groups_reading(
            ((e.key, e.value) for e in entries), name, int(time.time() * 1000), within_ms
        )

    async def list_topics(self) -> list[dict[str, Any]]:
        return [_topic_row(t) for t in await self.client.controller.list_topics()]

    async def list_topics_page(
        self, *, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> tuple[list[dict[str, Any]], str]:
        """At most `limit` topics in name order after `start_after` that begin with `prefix`, and
        the name to pass as `start_after` for the next page ("" after the last)."""
        page, after = await self.client.controller.list_topics_page(
            prefix=prefix, start_after=start_after, limit=limit
        )
        return [_topic_row(t) for t in page], after

    async def describe_topic(self, name: str) -> list[dict[str, Any]]:
        route = await self.client.route(name, refresh=True)
        out = []
        deadline = time.monotonic() + TOPIC_PROPAGATION_S
        for bs in route.broker_sets:
            for q in range(bs.queues):
                o = await self._queue_offsets(bs, name, q, deadline)
                out.append(
                    {"broker_set": bs.name, "queue": q, "min": o.min, "max": o.max, "confirmed": o.confirmed}
                )
        return out

    async def _queue_offsets(self, bs: Any, name: str, queue: int, deadline: float) -> Any:
        """A queue's offsets from its brokers; a topic just created is not known to them until
        their next heartbeat's answer, and a slave serves it only once the master's generation
        marker has reached it, so TOPIC_NOT_FOUND and TOPIC_GENERATION_PENDING are asked again
        until `deadline` (past it, the last answer is the caller's; a broker set that does not
        answer is the caller's at once)."""
        while True:
            try:
                return await self.client.queue_offsets(bs, name, queue)
            except (TopicNotFoundError, TopicGenerationPendingError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.1)


def _topic_row(t: cpb.TopicConfig) -> dict[str, Any]:
    return {"name": t.name, "queues": dict(t.queues), "perm": t.perm, "retention_ms": int(t.retention_ms)}
