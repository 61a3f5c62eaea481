"""The operator's changes to a consumer group: reset its offsets, delete it, and who its members are.

A thin I/O shell over client/resetplan.py (the decisions) and client/assign.py (who is live):
it reads the route, the queues' offsets, the group's commits and its keys in the controller's
metadata store, lets the pure code decide, and only then writes — commits through each broker
set's master, its queues' in one call (`CommitOffsets`: all or none), tombstones through each broker
set's master (`DeleteGroupOffsets`, broker/offsets.py), then the owner keys. A refused or invalid
request writes nothing.

Both are refused while the group has live members reading the topic (`GroupInUseError`; not a
reset's dry run, which writes nothing and names them): a member keeps its position in memory
and its next commit would undo the change. With `force` they go ahead and then delete the owner
keys of the queues changed: each member finds its queues taken from it (client/handover.py
`lost`), drops them without committing, and takes them again at the next rebalance from the new
commits (or, after a delete, from its configured start). A member that commits in the moment
between the two steps keeps its own position: run the command again. Members that join while
the command runs are not seen either (as in RocketMQ). The writes to several broker sets are
not one transaction: one that fails (a master lost meanwhile) leaves the queues before it
changed and the rest not, and running the command again completes it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tidelog.client import assign as asg
from tidelog.client import handover as ho
from tidelog.client import resetplan as rp
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.errors import (
    GroupInUseError,
    GroupNotFoundError,
    InvalidArgumentError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
)
from tidelog.proto import broker_pb2 as bpb

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncAdmin, AsyncClient

log = logging.getLogger(__name__)


async def live_members(
    client: AsyncClient, group: str, topics: Iterable[str] | None = None
) -> dict[str, str]:
    """Member id -> topic of the group's live members (reading one of `topics`, if given)."""
    prefix = asg.members_prefix(group)
    entries = await client.controller.meta_list(prefix)
    return asg.active_members(((e.key, e.value) for e in entries), prefix, int(time.time() * 1000), topics)


async def member_modes(client: AsyncClient, group: str) -> dict[str, str]:
    """Member id -> subscription mode, of every member that announced itself (live or not)."""
    prefix = asg.members_prefix(group)
    entries = await client.controller.meta_list(prefix)
    return asg.modes(((e.key, e.value) for e in entries), prefix)


async def _refuse_if_live(
    client: AsyncClient, group: str, topics: list[str] | None, force: bool
) -> list[str]:
    """The live members reading `topics` (all topics: None); GroupInUseError if any, unless `force`."""
    live = await live_members(client, group, topics)
    if live and not force:
        reading = ", ".join(f"{m} ({t})" for m, t in live.items())
        raise GroupInUseError(
            f"group {group} has {len(live)} live member(s): {reading}; nothing was changed",
            group=group,
            members=sorted(live),
        )
    return sorted(live)


async def _committed_anywhere(client: AsyncClient, group: str, sets: Iterable[BrokerSetRoute]) -> bool:
    for bs in sets:
        reply = await client.ask_replicas(bs, "ListGroupOffsets", bpb.ListGroupOffsetsRequest(group=group))
        if reply.offsets:
            return True
    return False


async def require_known(client: AsyncClient, group: str, sets: Iterable[BrokerSetRoute]) -> None:
    """GroupNotFoundError unless the group has a key in the metadata store (a member, a topic it
    read, an owner key) or a commit in one of the broker sets."""
    if await client.controller.meta_list(asg.group_prefix(group)):
        return
    if not await _committed_anywhere(client, group, sets):
        raise GroupNotFoundError(f"no consumer group {group!r}: no member, no committed offset", group=group)


async def _drop_owner_keys(client: AsyncClient, group: str, topic: str, queues: Iterable[ho.Queue]) -> int:
    """Delete the owner keys of `queues` (at the version read), so that their holders start them
    again from the group's commits; returns how many were deleted."""
    prefix = ho.owners_prefix(group, topic)
    owners = ho.parse_owners(
        ((e.key, e.value, e.version) for e in await client.controller.meta_list(prefix)), prefix
    )
    dropped = 0
    for q in sorted(set(queues) & set(owners)):
        with contextlib.suppress(MetadataNotFoundError, MetadataVersionMismatchError):
            await client.controller.meta_delete(ho.owner_key(group, topic, q), owners[q].version)
            dropped += 1
    return dropped


async def _states(
    admin: AsyncAdmin, route: TopicRoute, group: str, chosen: list[ho.Queue], target: rp.Target
) -> list[rp.QueueState]:
    rows = {(r["broker_set"], r["queue"]): r for r in await admin.group_lag(group, route.topic)}
    states = []
    for bs_name, q in chosen:
        row = rows[(bs_name, q)]
        at_time = None
        if target.timestamp_ms is not None:
            bs = route.broker_set(bs_name)
            if bs is None:
                raise InvalidArgumentError(f"the route of {route.topic} lost broker set {bs_name}")
            req = bpb.SearchOffsetRequest(topic=route.topic, queue=q, timestamp_ms=target.timestamp_ms)
            at_time = (await admin.client.ask_replicas(bs, "SearchOffset", req)).offset
        states.append(rp.QueueState((bs_name, q), row["min"], row["confirmed"], row["committed"], at_time))
    return states


async def reset_offsets(
    admin: AsyncAdmin,
    group: str,
    topic: str,
    target: rp.Target,
    *,
    queue: int | None = None,
    broker_sets: Iterable[str] = (),
    force: bool = False,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Set the group's committed offset of the selected queues of `topic` (all, or those of
    `broker_sets` and/or with id `queue`) to `target`; `dry_run`: only say what would be set."""
    asg.check_group_name(group)
    client = admin.client
    route = await client.route(topic, refresh=True)  # TopicNotFoundError for a topic that is not there
    chosen = rp.select_queues(route.queue_list, queue, list(broker_sets))
    await require_known(client, group, route.broker_sets)
    # a dry run writes nothing, so live members do not stop it: it names them
    live = await _refuse_if_live(client, group, [topic], force or dry_run)
    plan = rp.plan_reset(target, await _states(admin, route, group, chosen, target))
    if not dry_run:
        # one call per broker set: its queues are reset together or not at all
        commits: dict[str, tuple[BrokerSetRoute, list[bpb.CommitOffsetRequest]]] = {}
        for p in plan:
            bs = route.broker_set(p.queue[0])
            if bs is None:
                raise InvalidArgumentError(f"the route of {topic} lost broker set {p.queue[0]}")
            commits.setdefault(bs.name, (bs, []))[1].append(
                bpb.CommitOffsetRequest(group=group, topic=topic, queue=p.queue[1], offset=p.after)
            )
        for bs, of_set in commits.values():
            req = bpb.CommitOffsetsRequest(commits=of_set)
            await client.call_master(topic, bs, "CommitOffsets", req, client.rpc_timeout)
        if live:
            await _drop_owner_keys(client, group, topic, [p.queue for p in plan])
        log.info("group %s on %s reset to %s on %d queue(s)", group, topic, target.to, len(plan))
    return {
        "group": group,
        "topic": topic,
        "to": target.to,
        "dry_run": dry_run,
        "live_members": live,
        "queues": [
            {"broker_set": p.queue[0], "queue": p.queue[1], "before": p.before, "after": p.after}
            for p in plan
        ],
    }


async def _broker_sets(admin: AsyncAdmin, topics: list[str]) -> dict[str, tuple[str, BrokerSetRoute]]:
    """broker set name -> (a topic it serves, its route): where a group's commits can be."""
    out: dict[str, tuple[str, BrokerSetRoute]] = {}
    for topic in topics:
        for bs in (await admin.client.route(topic, refresh=True)).broker_sets:
            out.setdefault(bs.name, (topic, bs))
    return out


async def delete_group(
    admin: AsyncAdmin, group: str, topic: str | None = None, *, force: bool = False
) -> dict[str, Any]:
    """Delete the group's committed offsets (of `topic`, or of every topic) in every broker set,
    and its keys in the metadata store (owner keys and read topics; without `topic`, also the
    member keys of members that are not live)."""
    asg.check_group_name(group)
    client = admin.client
    topics = [topic] if topic is not None else [t["name"] for t in await admin.list_topics()]
    sets = await _broker_sets(admin, topics)  # TopicNotFoundError for a named topic not there
    await require_known(client, group, [bs for _, bs in sets.values()])
    live = await _refuse_if_live(client, group, None if topic is None else [topic], force)
    deleted = []
    for name, (via, bs) in sorted(sets.items()):
        req = bpb.DeleteGroupOffsetsRequest(group=group, topic=topic or "")
        reply = await client.call_master(via, bs, "DeleteGroupOffsets", req, client.rpc_timeout)
        deleted += [
            {"broker_set": name, "topic": d.topic, "queue": d.queue, "offset": d.offset}
            for d in reply.deleted
        ]
    keys = await _delete_keys(client, group, topic, live)
    log.info("group %s: deleted %d committed offsets and %d keys", group, len(deleted), keys)
    return {"group": group, "topic": topic, "deleted": deleted, "keys_deleted": keys, "live_members": live}


async def _delete_keys(client: AsyncClient, group: str, topic: str | None, live: list[str]) -> int:
    """The group's keys that go with its offsets: of `topic` (its owner keys and the record that
    the group read it), or every key but the live members' own (they announce again anyway)."""
    if topic is None:
        keep = {asg.members_prefix(group) + m for m in live}
        entries = [e for e in await client.controller.meta_list(asg.group_prefix(group)) if e.key not in keep]
    else:
        read = asg.topics_prefix(group) + topic  # a prefix of other topics' keys too: exact match
        entries = await client.controller.meta_list(ho.owners_prefix(group, topic))
        entries += [e for e in await client.controller.meta_list(read) if e.key == read]
    deleted = 0
    for e in entries:
        with contextlib.suppress(MetadataNotFoundError, MetadataVersionMismatchError):
            await client.controller.meta_delete(e.key, e.version)
            deleted += 1
    return deleted
