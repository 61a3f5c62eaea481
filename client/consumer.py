"""The consumer group member: announces itself, takes and releases queues, polls and commits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from tidelog.client import assign as asg
from tidelog.client import handover as ho
from tidelog.client import modes as md
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.client.transport import ConsumedMessage
from tidelog.errors import (
    ControllerUnavailableError,
    FlushSlaveTimeoutError,
    InSyncReplicasNotEnoughError,
    InvalidArgumentError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    NotMasterError,
    SubscriptionConflictError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.invariants import present
from tidelog.proto import broker_pb2 as bpb

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

log = logging.getLogger(__name__)

# While the controllers are away, a group member tries a rebalance this often (each try may wait
# for the controller client's quorum timeout).
AWAY_RETRY_S = 3.0
# How long a closing member keeps offering a commit that no master took (a failover under way):
# the new master is elected within the controller's heartbeat timeout and serves from its next
# heartbeat. Past it the commit is given up, and the queue's next owner reads again from the last
# commit (at least once).
CLOSE_COMMIT_WAIT_S = 15.0
CLOSE_COMMIT_RETRY_S = 0.25


#: A rebalance listener: called with the (broker set, queue) pairs concerned, on the client's loop.
RebalanceListener = Callable[[list[tuple[str, int]]], None]


async def commit_on_master(
    client: AsyncClient,
    address: str,
    group: str,
    topic: str,
    commits: Sequence[tuple[tuple[str, int], int]],
) -> None:
    """Commit ((broker set, queue), offset) of `commits` at the master at `address`, in one write
    (all or none), through the client's commit pace (client/committer.py): with the commits of
    its other groups' members, in as few calls as it spaces them."""
    await client.commits.commit(address, [(group, topic, q[1], pos) for q, pos in commits])


class AsyncConsumer:
    """A member of a consumer group, in one of the subscription modes of client/modes.py:
    `clustering` (the default: the group's live members share the queues), `failover` (one active
    member reads them all, standbys take over), `exclusive` (one member; a second is refused) or
    `broadcast` (every member reads everything, with its own offsets).

    A queue is read by the member holding its owner key (client/handover.py). At each rebalance
    the member releases the queues the sticky assignment gives elsewhere (`on_revoked`, stop
    pulling, commit what `poll` returned, delete the key) and takes the free ones (create the key,
    start at the committed offset, `on_assigned`), so a clean hand-over delivers nothing twice.
    """

    def __init__(
        self,
        client: AsyncClient,
        group: str,
        topic: str,
        *,
        member_id: str | None = None,
        auto_commit: bool = True,
        auto_commit_interval: float = 5.0,
        start: str = "earliest",
        session_timeout: float = 6.0,
        heartbeat_interval: float = 1.0,
        on_assigned: RebalanceListener | None = None,
        on_revoked: RebalanceListener | None = None,
        mode: str = md.CLUSTERING,
    ) -> None:
        asg.check_group_name(group)
        if mode not in md.MODES:
            raise InvalidArgumentError(f"mode must be one of {', '.join(md.MODES)}, not {mode!r}")
        if start not in ("earliest", "latest"):
            raise InvalidArgumentError("start must be 'earliest' or 'latest'")
        self.client = client
        self.group = group
        self.topic = topic
        self.member_id = member_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if "/" in self.member_id or "@" in self.member_id:
            raise InvalidArgumentError("member_id must not contain '/' or '@'")
        self.mode = mode
        # Owner keys and commits live under this name (`<group>@<member>` in broadcast mode).
        self._state = md.state_group(group, mode, self.member_id)
        self._since_ms: int | None = None  # the first announcement's time
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.start = start
        self.session_timeout_ms = int(session_timeout * 1000)
        self.heartbeat_interval = heartbeat_interval
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        # Queues whose owner key this member holds and that it started: the delivered position.
        self.positions: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        # Revoked queues not yet released (their commit was deferred): held, but no longer pulled.
        self._revoked: set[tuple[str, int]] = set()
        self._key = asg.members_prefix(group) + self.member_id
        self._owners_prefix = ho.owners_prefix(self._state, topic)
        self._version: int | None = None
        self._last_beat = 0.0
        self._last_commit = time.monotonic()
        self._rr = 0
        self._closed = False
        self._away_until = 0.0  # while the controllers are away: when to try a rebalance again

    @property
    def assignment(self) -> list[tuple[str, int]]:
        """The queues this member reads now."""
        return sorted(q for q in self.positions if q not in self._revoked)

    @property
    def committed(self) -> dict[tuple[str, int], int]:
        """The offsets this member last committed (or started from), per owned queue."""
        return dict(self._committed)

    async def _announce(self) -> None:
        now_ms = int(time.time() * 1000)
        if self._since_ms is None:
            self._since_ms = now_ms
        value = asg.announcement(now_ms, self.topic, self.session_timeout_ms, self.mode, self._since_ms)
        c = self.client.controller
        if self._version is None:
            # Remember the group's topic beyond this member's life: the member key goes on close.
            with contextlib.suppress(MetadataExistsError):
                await c.meta_create(asg.topics_prefix(self.group) + self.topic, b"")
        try:
            if self._version is None:
                entry = await c.meta_create(self._key, value)
            else:
                entry = await c.meta_cas(self._key, value, self._version)
        except (MetadataExistsError, MetadataVersionMismatchError, MetadataNotFoundError):
            with contextlib.suppress(MetadataNotFoundError):
                await c.meta_delete(self._key)
            entry = await c.meta_create(self._key, value)
        self._version = entry.version

    async def _read_group(self) -> tuple[dict[str, md.Announced], dict[tuple[str, int], ho.Owner]]:
        """The live members reading this topic (with their modes), and the owner keys of its queues."""
        prefix = asg.members_prefix(self.group)
        entries = await self.client.controller.meta_list(prefix)
        live = asg.live_announced(
            ((e.key, e.value) for e in entries),
            prefix,
            int(time.time() * 1000),
            self.session_timeout_ms,
            self.topic,
        )
        keys = await self.client.controller.meta_list(self._owners_prefix)
        return live, ho.parse_owners(((e.key, e.value, e.version) for e in keys), self._owners_prefix)

    async def rebalance(self, force: bool = False) -> None:
        """Announce this member, then follow the hand-over plan: drop the queues another member
        took over, release those the assignment moves elsewhere, take the free ones."""
        now = time.monotonic()
        if not force and now - self._last_beat < self.heartbeat_interval:
            return
        self._last_beat = now
        await self._announce()
        route = await self.client.route(self.topic, refresh=force, need="consume")
        live, owners = await self._read_group()
        other = md.conflict(self.member_id, md.Announced(self.mode, self._since_ms or 0), live)
        if other is not None:
            await self._refuse(
                f"member {other} of group {self.group} reads {self.topic} in {live[other].mode} mode"
            )
        active = await self._claim_active(set(live)) if self.mode in md.SINGLE_ACTIVE else None
        sharing = md.sharing(self.mode, self.member_id, live, active)
        step = ho.plan(self.member_id, sharing, route.queue_list, owners, self.positions, self._revoked)
        for q in step.lost:
            log.info("group %s: queue %s was taken over; member %s stops", self.group, q, self.member_id)
            self._drop(q)
        if step.resume:
            self._revoked.difference_update(step.resume)
            if self.on_assigned is not None:
                self.on_assigned(list(step.resume))
        await self._release({q: owners[q].version for q in step.release})
        taken = await self._take(route, step)
        if step.lost or step.release or taken:
            log.info("group %s member %s owns %s", self.group, self.member_id, self.assignment)

    async def _claim_active(self, live: set[str]) -> str | None:
        """Failover and exclusive modes: the member holding the group's active key after this
        member took it if it could (None: nobody yet); refuses this member (exclusive) when
        another live member holds it."""
        c = self.client.controller
        key = md.active_key(self.group, self.topic)
        try:
            entry = await c.meta_get(key)
            holder: tuple[str, int] | None = (entry.value.decode(errors="replace"), entry.version)
        except MetadataNotFoundError:
            holder = None
        decision = md.decide_active(self.member_id, self.mode, holder, live)
        me = self.member_id.encode()
        try:
            if decision.action == "create":
                await c.meta_create(key, me)
            elif decision.action == "replace":
                await c.meta_cas(key, me, present(decision.version, "a replace names the key's version"))
                log.info(
                    "group %s: member %s takes %s over from %s, whose session expired",
                    self.group,
                    self.member_id,
                    self.topic,
                    decision.holder,
                )
            elif decision.action == "refuse":
                await self._refuse(
                    f"member {decision.holder} of group {self.group} reads {self.topic} exclusively"
                )
            else:
                return decision.holder
        except (MetadataExistsError, MetadataVersionMismatchError, MetadataNotFoundError):
            return None  # another member was quicker: the next round says who
        return self.member_id

    async def _refuse(self, why: str) -> NoReturn:
        """Leave the group (stop reading, commit and release what this member held, withdraw its
        announcement) and raise SubscriptionConflictError."""
        with contextlib.suppress(TidelogError):
            _, owners = await self._read_group()
            await self._release(
                {q: o.version for q, o in owners.items() if o.member == self.member_id}, closing=True
            )
        self.positions.clear()
        self._committed.clear()
        self._revoked.clear()
        with contextlib.suppress(TidelogError):
            await self.client.controller.meta_delete(self._key)
        self._version = None
        raise SubscriptionConflictError(why)

    async def _release(self, keys: Mapping[tuple[str, int], int], *, closing: bool = False) -> None:
        """Revoke → commit → release: stop pulling `keys` (queue → owner key version), commit what
        was delivered, then delete each key. A queue whose commit was deferred keeps its key (and
        nobody reads it) until a later rebalance commits it, unless this member is closing."""
        if not keys:
            return
        fresh = sorted(q for q in keys if q in self.positions and q not in self._revoked)
        self._revoked.update(keys)
        if fresh and self.on_revoked is not None:
            self.on_revoked(fresh)
        if self.auto_commit:
            await self._commit(list(keys))
            if closing:
                await self._commit_before_leaving(list(keys))
        for q, version in sorted(keys.items()):
            pending = self.auto_commit and bool(self._uncommitted([q]))
            if pending and not closing:
                continue
            # Gone or at another version: the key was taken over after this member's session
            # lapsed; either way it is no longer this member's.
            with contextlib.suppress(MetadataNotFoundError, MetadataVersionMismatchError):
                await self.client.controller.meta_delete(ho.owner_key(self._state, self.topic, q), version)
            self._drop(q)

    def _uncommitted(self, queues: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        return [q for q in queues if q in self.positions and self._committed.get(q) != self.positions[q]]

    async def _commit_before_leaving(self, queues: Sequence[tuple[str, int]]) -> None:
        """A closing member's commits that no master took (deferred: the master died or has not
        taken its role yet), offered again until one does or `CLOSE_COMMIT_WAIT_S` passes: once
        it leaves, nobody commits what it delivered, and the queue's next owner would read it
        again."""
        deadline = time.monotonic() + CLOSE_COMMIT_WAIT_S
        while self._uncommitted(queues) and time.monotonic() < deadline:
            await asyncio.sleep(CLOSE_COMMIT_RETRY_S)
            try:
                await self._commit(queues)
            except TidelogError as exc:  # no route yet (the controllers away): try again
                log.info("closing commit of %s/%s waits: %s", self.group, self.topic, exc)
        left = self._uncommitted(queues)
        if left:
            log.warning(
                "%s/%s: no master took the closing commit of %s within %.0f s; their next owner "
                "reads again from the last commit",
                self.group,
                self.topic,
                left,
                CLOSE_COMMIT_WAIT_S,
            )

    def _drop(self, q: tuple[str, int]) -> None:
        self.positions.pop(q, None)
        self._committed.pop(q, None)
        self._revoked.discard(q)

    async def _take(self, route: TopicRoute, step: ho.Plan) -> list[tuple[str, int]]:
        """Claim the plan's queues (create a free key, replace an expired holder's at its version)
        and start each claimed one at the committed offset; returns the queues started."""
        c = self.client.controller
        me = self.member_id.encode()
        claimed = list(step.adopt)
        for q in step.take:
            with contextlib.suppress(MetadataExistsError):  # another member was quicker
                await c.meta_create(ho.owner_key(self._state, self.topic, q), me)
                claimed.append(q)
        for q, version in step.take_over:
            with contextlib.suppress(MetadataVersionMismatchError, MetadataNotFoundError):
                await c.meta_cas(ho.owner_key(self._state, self.topic, q), me, version)
                claimed.append(q)
        started = []
        for q in sorted(claimed):
            try:
                self.positions[q] = await self._start_offset(route, q)
                started.append(q)
            except (TopicNotFoundError, UnavailableError) as exc:
                # The route has the topic but no replica serves it yet (a broker learns a new topic
                # from its next heartbeat) or none answers: the key is held, so the next rebalance
                # adopts it and tries again.
                log.info("group %s: queue %s not started yet: %s", self.group, q, exc)
        if started and self.on_assigned is not None:
            self.on_assigned(started)
        return started

    async def _start_offset(self, route: TopicRoute, q: tuple[str, int]) -> int:
        bs = present(route.broker_set(q[0]), f"the route of {q[0]} lost its broker set")
        committed = await self.fetch_committed(bs, q[1])
        if committed is not None:
            self._committed[q] = committed
            return committed
        offsets = await self.client.queue_offsets(bs, self.topic, q[1])
        return offsets.min if self.start == "earliest" else offsets.confirmed

    async def fetch_committed(self, bs: BrokerSetRoute, queue: int) -> int | None:
        """The group's committed offset of `queue` in broker set `bs` (None: nothing committed)."""
        req = bpb.FetchOffsetRequest(group=self._state, topic=self.topic, queue=queue)
        reply = await self.client.ask_replicas(bs, "FetchOffset", req)
        return reply.offset if reply.found else None

    async def rebalance_or_carry_on(self) -> None:
        """`rebalance`, except while no controller quorum answers: then the queues this member holds
        stay its own (nobody can take an owner key over without the controllers) and it reads on,
        trying a rebalance again every `AWAY_RETRY_S`. A member that never joined has nothing to
        read on and raises CONTROLLER_UNAVAILABLE, except in the shared modes, where no queue
        changes hands and a member receives at once."""
        if time.monotonic() < self._away_until:
            return
        try:
            await self.rebalance()
        except ControllerUnavailableError as exc:
            if self._version is None and self.mode not in md.PER_MESSAGE:
                raise  # never joined: it owns no queue to read on, and says why it cannot start
            if not self._away_until:
                log.warning(
                    "group %s member %s: no controller quorum (%s); reading on %s",
                    self.group,
                    self.member_id,
                    exc.message,
                    self.assignment or "no queue until it returns",
                )
            self._away_until = time.monotonic() + AWAY_RETRY_S
            return
        if self._away_until:
            log.info("group %s member %s: the controllers answer again", self.group, self.member_id)
            self._away_until = 0.0

    async def poll(self, max_messages: int = 100, timeout: float = 1.0) -> list[ConsumedMessage]:
        """Messages from this member's queues, each queue in order; waits up to `timeout` for some."""
        await self.rebalance_or_carry_on()
        if self.auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval:
            await self.commit()
        queues = self.assignment
        if not queues:
            await asyncio.sleep(min(timeout, self.heartbeat_interval))
            return []
        route = await self.client.route(self.topic, need="consume")
        self._rr = (self._rr + 1) % len(queues)
        queues = queues[self._rr :] + queues[: self._rr]
        # Never pull more than can be returned: a pulled message moves its queue's position, so
        # one dropped here would be skipped for good (and committed past).
        queues = queues[: max(1, max_messages)]
        per_queue = max(1, max_messages // len(queues))
        out: list[ConsumedMessage] = []
        for wait_ms in (0, int(timeout * 1000)):
            pulls = [self._pull_one(route, q, per_queue, wait_ms) for q in queues]
            if wait_ms:
                out.extend(await _first_non_empty(pulls))
            else:
                for msgs in await asyncio.gather(*pulls):
                    out.extend(msgs)
            if out or timeout <= 0:
                break
        return out

    async def _pull_one(
        self, route: TopicRoute, q: tuple[str, int], max_messages: int, wait_ms: int
    ) -> list[ConsumedMessage]:
        bs = route.broker_set(q[0])
        if bs is None or q not in self.positions or q in self._revoked:
            return []
        try:
            msgs, nxt = await self.client.pull(
                bs, self.topic, q[1], self.positions[q], max_messages=max_messages, wait_ms=wait_ms
            )
        except (UnavailableError, TopicNotFoundError):
            # Not served right now; a topic that is really gone fails the controller route instead.
            self.client.forget_route(self.topic)
            return []
        if q in self.positions and msgs:
            self.positions[q] = nxt
        return msgs

    async def commit(self) -> None:
        """Commit the delivered position of every owned queue (at-least-once on failover)."""
        await self._commit(list(self.positions))

    async def _commit(self, queues: Sequence[tuple[str, int]]) -> None:
        self._last_commit = time.monotonic()
        todo = self._uncommitted(queues)
        if not todo:
            return  # nothing moved: no route lookup (which may wait out an unreachable controller)
        route = await self.client.route(self.topic, need="consume")
        by_master: dict[str, list[tuple[tuple[str, int], int]]] = {}
        for q in todo:
            pos = self.positions.get(q)
            if pos is None or self._committed.get(q) == pos:
                continue
            bs = route.broker_set(q[0])
            if bs is None or not bs.master_address:
                continue
            by_master.setdefault(bs.master_address, []).append((q, pos))
        for address, commits in by_master.items():
            try:
                await commit_on_master(self.client, address, self._state, self.topic, commits)
            except (
                NotMasterError,
                UnavailableError,
                InSyncReplicasNotEnoughError,
                FlushSlaveTimeoutError,
            ) as exc:
                log.info(
                    "commit of %s/%s queues %s deferred: %s",
                    self.group,
                    self.topic,
                    [q for q, _ in commits],
                    exc,
                )
                self.client.forget_route(self.topic)
                continue
            for q, pos in commits:
                self._committed[q] = pos

    async def close(self) -> None:
        """Commit and release every queue this member holds, then leave the group: the members
        that take its queues over start where it stopped."""
        if self._closed:
            return
        self._closed = True
        if self._version is None:
            return  # never announced (e.g. the controller was unreachable): nothing to take back
        try:
            _, owners = await self._read_group()
        except TidelogError:
            # The owner keys cannot be read: commit anyway, so that whoever takes over once this
            # member's session lapses starts where it stopped.
            if self.auto_commit:
                with contextlib.suppress(TidelogError):
                    await self.commit()
        else:
            mine = {q: o.version for q, o in owners.items() if o.member == self.member_id}
            with contextlib.suppress(TidelogError):
                await self._release(mine, closing=True)
            if self.mode in md.SINGLE_ACTIVE:
                # After the commits: the standby that takes the key starts where this member stopped.
                with contextlib.suppress(TidelogError):
                    entry = await self.client.controller.meta_get(md.active_key(self.group, self.topic))
                    if entry.value == self.member_id.encode():
                        await self.client.controller.meta_delete(entry.key, entry.version)
        with contextlib.suppress(TidelogError):
            await self.client.controller.meta_delete(self._key)


async def _first_non_empty(coros: list[Any]) -> list[ConsumedMessage]:
    tasks = [asyncio.ensure_future(c) for c in coros]
    out: list[ConsumedMessage] = []
    try:
        pending = set(tasks)
        while pending and not out:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                out.extend(t.result())
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out
