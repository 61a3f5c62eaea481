"""RocketMQ consumers of the endpoint (broker/rocketmq.py) as members of their consumer group, so
that `tide group describe` (client/groupadmin.py) lists them beside tidelog's own consumers.

A RocketMQ consumer announces itself as tidelog's consumers do (client/assign.py): a key
`group/<group>/members/<member id>` in the controllers' metadata store, mode `shared`, one key
per topic it consumes (an announcement names one topic), member id `rocketmqrules.member_id`.
What the endpoint learns of a consumer: its client id (the `x-mq-client-id` metadata of every
call), its group and topics (the Settings of its Telemetry stream, each ReceiveMessage), and that
it lives (its Heartbeat, every 10 s, and its receives). Each of those renews its announcements, at
most once per ANNOUNCE_S; a consumer that stops calling lapses after SESSION_MS (three missed
heartbeats), as a tidelog member does, and one that shuts down (NotifyClientTermination) has its
keys deleted at once.

Announcements are written in the background: a call never waits for the controllers, and a
failed write is logged and tried again at the next renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker import rocketmqrules as rules
from tidelog.client import assign as asg
from tidelog.client.modes import SHARED
from tidelog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    TidelogError,
)
from tidelog.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

log = logging.getLogger(__name__)

ANNOUNCE_S = 5.0
SESSION_MS = 30_000  # the clients heartbeat every 10 s
FORGET_S = 120.0  # a consumer not heard from for this long is forgotten here (its keys lapsed)


class _Member:
    def __init__(self, now_ms: int) -> None:
        self.since_ms = now_ms
        self.last_call = time.monotonic()
        self.announced: dict[str, float] = {}  # topic -> when last announced (monotonic)
        self.versions: dict[str, int] = {}  # topic -> its key's version, as last written


class Members:
    """The RocketMQ consumers this endpoint hears from, announced as shared-mode members."""

    def __init__(self, client: Transport) -> None:
        self.client = client
        self._members: dict[tuple[str, str], _Member] = {}  # (group, client id) -> member
        self._tasks: set[asyncio.Task[None]] = set()

    def seen(self, group: str, client_id: str, topics: Iterable[str] = ()) -> None:
        """A call of consumer `client_id` of `group` (naming `topics`, if it does): renew its
        announcements, those of topics learned before included."""
        if not group or not client_id:
            return
        now = time.monotonic()
        member = self._members.get((group, client_id))
        if member is None:
            member = self._members[(group, client_id)] = _Member(int(time.time() * 1000))
        member.last_call = now
        for topic in topics:
            member.announced.setdefault(topic, 0.0)
        due = [t for t, at in member.announced.items() if now - at >= ANNOUNCE_S]
        for topic in due:
            member.announced[topic] = now
            self._spawn(self._announce(group, client_id, topic, member))
        self._forget_idle(now)

    def gone(self, group: str, client_id: str) -> None:
        """Consumer `client_id` of `group` shut down: its keys go now."""
        member = self._members.pop((group, client_id), None)
        if member is not None:
            self._spawn(self._retire(group, client_id, list(member.announced)))

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_idle(self, now: float) -> None:
        for key in [k for k, m in self._members.items() if now - m.last_call > FORGET_S]:
            del self._members[key]

    async def _announce(self, group: str, client_id: str, topic: str, member: _Member) -> None:
        key = asg.members_prefix(group) + rules.member_id(client_id, topic)
        value = asg.announcement(int(time.time() * 1000), topic, SESSION_MS, SHARED, member.since_ms)
        c = self.client.controller
        try:
            if topic not in member.versions:
                # the group's topic outlives its members (describe lists it), as for tidelog's own
                with contextlib.suppress(MetadataExistsError):
                    await c.meta_create(asg.topics_prefix(group) + topic, b"")
            try:
                if topic in member.versions:
                    entry = await c.meta_cas(key, value, member.versions[topic])
                else:
                    entry = await c.meta_create(key, value)
            except (MetadataExistsError, MetadataVersionMismatchError):
                # another endpoint of the cluster announced this consumer too (it calls one per
                # broker set): write over the key as it is now
                current = await c.meta_get(key)
                entry = await c.meta_cas(key, value, current.version)
            except MetadataNotFoundError:
                entry = await c.meta_create(key, value)
            member.versions[topic] = entry.version
        except TidelogError as exc:
            member.announced[topic] = 0.0  # again at its next call
            log.info("RocketMQ consumer %s of group %s not announced: %s", client_id, group, exc)

    async def _retire(self, group: str, client_id: str, topics: list[str]) -> None:
        for topic in topics:
            key = asg.members_prefix(group) + rules.member_id(client_id, topic)
            try:
                await self.client.controller.meta_delete(key)
            except MetadataNotFoundError:
                pass
            except TidelogError as exc:  # its announcement lapses after SESSION_MS anyway
                log.info("RocketMQ consumer %s of group %s not retired: %s", client_id, group, exc)
