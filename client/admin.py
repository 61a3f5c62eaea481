"""The admin API: topics and broker sets (client/topicadmin.py), and consumer groups: their
topics, members and modes, lag, offset resets and deletion."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tidelog.client import assign as asg
from tidelog.client import groupadmin as ga
from tidelog.client import handover as ho
from tidelog.client import resetplan as rp
from tidelog.client.consumer import AsyncConsumer
from tidelog.client.topicadmin import MAX_TOPICS_PER_CALL, TopicAdmin

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

log = logging.getLogger(__name__)

__all__ = ["MAX_TOPICS_PER_CALL", "AsyncAdmin", "TopicAdmin"]


class AsyncAdmin(TopicAdmin):
    """Topics, broker sets and consumer groups."""

    client: AsyncClient

    async def group_topics(self, group: str) -> list[str]:
        """Topics the group's members announced, live or gone (members forget theirs on close)."""
        import json

        prefix = asg.topics_prefix(group)
        topics = {e.key[len(prefix) :] for e in await self.client.controller.meta_list(prefix)}
        for e in await self.client.controller.meta_list(asg.members_prefix(group)):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                topics.add(json.loads(e.value)["topic"])
        return sorted(topics)

    async def group_members(self, group: str, topic: str | None = None) -> dict[str, str]:
        """Member id -> topic of the group's live members (those reading `topic`, if given), each
        judged by the session timeout it announced."""
        return await ga.live_members(self.client, group, None if topic is None else [topic])

    async def group_modes(self, group: str) -> dict[str, str]:
        """Member id -> the subscription mode it announced (client/modes.py)."""
        return await ga.member_modes(self.client, group)

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        offset: int | None = None,
        timestamp: str | None = None,
        queue: int | None = None,
        broker_sets: Iterable[str] = (),
        force: bool = False,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Move the group's committed offsets of `topic`'s queues `to` "earliest", "latest",
        "timestamp" (`timestamp`: epoch ms or ISO-8601) or "offset" (`offset`); only the queues
        with id `queue` and/or of `broker_sets`, if given. Refused while the group has live
        members unless `force`; `dry_run` only says what each queue would get (client/groupadmin.py)."""
        target = rp.target(to, offset, timestamp)
        return await ga.reset_offsets(
            self, group, topic, target, queue=queue, broker_sets=broker_sets, force=force, dry_run=dry_run
        )

    async def delete_group(
        self, group: str, topic: str | None = None, *, force: bool = False
    ) -> dict[str, Any]:
        """Delete the group's committed offsets (of `topic`, else all) and its owner keys; refused
        while the group has live members unless `force` (client/groupadmin.py)."""
        return await ga.delete_group(self, group, topic, force=force)

    async def require_group(self, group: str, topic: str | None = None) -> None:
        """GroupNotFoundError unless the group is known: a key in the metadata store (a member, a
        topic it read, an owner key) or, with `topic`, a commit in one of its broker sets. The
        same answer for an unknown group from describe as from reset-offsets and delete."""
        sets = (await self.client.route(topic, refresh=True)).broker_sets if topic else ()
        await ga.require_known(self.client, group, sets)

    async def group_lag(self, group: str, topic: str) -> list[dict[str, Any]]:
        route = await self.client.route(topic, refresh=True)
        rows = []
        probe = AsyncConsumer(self.client, group, topic, auto_commit=False)
        prefix = ho.owners_prefix(group, topic)
        owners = ho.parse_owners(
            ((e.key, e.value, e.version) for e in await self.client.controller.meta_list(prefix)), prefix
        )
        for bs in route.broker_sets:
            for q in range(bs.queues):
                o = await self.client.queue_offsets(bs, topic, q)
                committed = await probe.fetch_committed(bs, q)
                rows.append(
                    {
                        "broker_set": bs.name,
                        "queue": q,
                        "min": o.min,
                        "committed": committed,
                        "confirmed": o.confirmed,
                        "lag": o.confirmed - (committed or o.min),
                        # the member holding the queue's owner key (client/handover.py), if any
                        "owner": owners[(bs.name, q)].member if (bs.name, q) in owners else None,
                    }
                )
        return rows
