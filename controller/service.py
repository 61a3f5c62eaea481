"""The controller's gRPC servicers (grpc.aio): broker-facing, client-facing and admin.

This layer only validates requests, builds commands and converts state to messages. Decisions
are made by `ControllerState.apply` (at apply time, on every replica) and by the election policy.

- Reads (routes, describe, topics, metadata, status) are answered by any node from its replica.
- Writes go through `ControllerNode.write`, which answers CONTROLLER_NOT_LEADER with the leader's
  gRPC address on a follower, and otherwise builds the command with `now_ms` and the leader's
  liveness snapshot *before* proposing it.
- Heartbeats never touch Raft: they live in every node's `HeartbeatTable`; only the leader answers one
  (a follower records the copy and answers CONTROLLER_NOT_LEADER).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import secrets
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import grpc

from tidelog import access
from tidelog.acl import AclState, Grant, User
from tidelog.controller import state as st
from tidelog.controller.liveness import heartbeat_problem
from tidelog.controller.placement import Violation, decommission_problem, ledger_repair, replacement_problem
from tidelog.controller.topics import MAX_TOPICS_PER_CREATE
from tidelog.errors import (
    ControllerBrokerMetadataNotExistError,
    ControllerBrokerNeedToBeRegisteredError,
    ControllerFencedSyncStateSetEpochError,
    EpochRejectedError,
    InvalidArgumentError,
    MetadataLimitReachedError,
    MetadataNotFoundError,
    MetadataTooLargeError,
    PlacementRefusedError,
    TopicLimitReachedError,
    TopicNotFoundError,
)
from tidelog.ledger.metadata import hash_password
from tidelog.ledger.params import ledger_id_of_key
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.wire import check_request, make_error, non_empty, non_negative, rpc

if TYPE_CHECKING:
    from tidelog.controller.node import ControllerNode

log = logging.getLogger(__name__)

MAX_KEY_LEN = 1024
MAX_META_PAGE = 100_000  # metadata entries in one MetaList page
_PERMS = ("rw", "r", "w")


# --- state -> messages ------------------------------------------------------------------------


# What fixes what `tide placement repair` cannot (RULES.md 8).
_ADVICE = {
    "NO_REPLICA": "start a broker of the set in each datacenter named NO_REPLICA "
    "(its config's datacenter label)",
    "DATACENTER_DOWN": "bring the datacenter's brokers back, or replace them: start a new broker there and "
    "run `tide broker replace OLD --with NEW` once it is in sync",
    "NOT_IN_SYNC": "wait: the master takes a returning replica into the SyncStateSet once it has caught up",
    "NO_MASTER": "bring back an in-sync replica (or see enable_elect_unclean_master)",
    "REPLICA_GONE": "run `tide placement repair` again once a live replica is in sync",
    "ENSEMBLE_ONE_DATACENTER": "the ledger was created on replicas of one datacenter; its new ensembles "
    "follow the set's in-sync replicas",
    "BROKER_SET_DEGRADED": "repair the ledger's broker set (its own violations)",
}


def _ledger_repair(
    broker_set: str, key: str, pairs: tuple[tuple[int, int], ...], ms_ago: int
) -> pb.LedgerRepair:
    item = pb.LedgerRepair(broker_set=broker_set, ledger=str(ledger_id_of_key(key)), ms_ago=ms_ago)
    for old, new in pairs:
        item.replaced[old] = new
    return item


def _violation(v: Violation, since_ms_ago: int) -> pb.PlacementViolation:
    return pb.PlacementViolation(
        kind=v.kind,
        name=v.name,
        code=v.code,
        broker_set=v.broker_set,
        reason=v.reason,
        since_ms_ago=since_ms_ago,
    )


def role_of(name: str, bs: st.BrokerSet | None) -> pb.RoleAssignment:
    role = pb.RoleAssignment(broker_set=name)
    if bs is None:
        return role
    role.master_epoch = bs.master_epoch
    role.sync_state_set.extend(sorted(bs.sync_state_set))
    role.sync_state_set_epoch = bs.sss_epoch
    role.last_unclean_epoch = bs.unclean_epoch
    if bs.master_id is not None:
        role.has_master = True
        role.master_id = bs.master_id
        master = bs.members.get(bs.master_id)
        if master is not None:
            role.master_address = master.address
            role.master_ha_address = master.ha_address
    return role


def members_of(bs: st.BrokerSet, alive: set[int] | None) -> list[pb.MemberInfo]:
    out = []
    for bid in sorted(bs.members):
        m = bs.members[bid]
        out.append(
            pb.MemberInfo(
                broker_id=bid,
                address=m.address,
                ha_address=m.ha_address,
                datacenter=m.datacenter,
                rack=m.rack,
                in_sync=bid in bs.sync_state_set,
                alive=alive is not None and bid in alive,
                last_epoch=m.last_epoch,
                last_max_offset=m.last_max_offset,
                is_master=bid == bs.master_id,
            )
        )
    return out


def topic_of(t: st.Topic) -> pb.TopicConfig:
    return pb.TopicConfig(
        name=t.name, queues=dict(t.queues), perm=t.perm, generation=t.generation, retention_ms=t.retention_ms
    )


def _create_args(request: pb.CreateTopicRequest) -> tuple[str, dict[str, int], str]:
    """A CreateTopicRequest's name, queues and perm, checked (InvalidArgumentError otherwise)."""
    name = non_empty("name", request.name)
    check_request(len(request.queues) > 0, "queues must name at least one broker set")
    for bs_name, n in request.queues.items():
        non_empty("queues key (broker set)", bs_name)
        check_request(0 < n <= 1024, f"queues[{bs_name}] must be in 1..1024 (got {n})")
    perm = request.perm or "rw"
    check_request(perm in _PERMS, f"perm must be one of {', '.join(_PERMS)} (got {perm!r})")
    return name, {k: int(v) for k, v in request.queues.items()}, perm


def user_of(u: User, with_key: bool = True) -> pb.User:
    return pb.User(name=u.name, access_key=u.access_key, signing_key=u.signing_key if with_key else "")


def grant_of(g: Grant) -> pb.Grant:
    return pb.Grant(user=g.user, kind=g.kind, pattern=g.pattern, permission=g.permission)


def acl_table_of(table: AclState) -> pb.AclTable:
    return pb.AclTable(
        version=table.version,
        users=[user_of(table.users[n]) for n in sorted(table.users)],
        grants=[grant_of(g) for g in sorted(table.grants)],
    )


def meta_of(e: st.MetaEntry) -> pb.MetaEntry:
    return pb.MetaEntry(key=e.key, value=bytes(e.value), version=e.version)


def _ledger_password_hash(request: pb.MetaCompareAndSetRequest | pb.MetaDeleteRequest) -> bytes | None:
    """The hash of the ledger password a metadata write carries: the state compares it with the
    ledger's (ledger/RULES.md M8); the password itself never enters the replicated log."""
    return hash_password(request.ledger_password) if request.HasField("ledger_password") else None


def field_bytes(message: Any, field: str, items: Iterable[Any]) -> bytes:
    """`items` as the repeated field `field` of `message` (a message class) serialized: the bytes
    a message holding only them serializes to, which `MergeFromString` adds to one. Built one item
    at a time and kept as bytes: 100,000 topics held as messages took 100 MB of a controller's
    memory for each list kept."""
    return b"".join(message(**{field: [m]}).SerializeToString(deterministic=True) for m in items)


def topics_part(state: st.ControllerState) -> tuple[bytes, bytes]:
    """Every topic in name order as `ClusterView.topics` bytes (`field_bytes`), and a digest of
    them (the part of the cluster view that grows)."""
    topics = field_bytes(pb.ClusterView, "topics", (topic_of(state.topics[n]) for n in sorted(state.topics)))
    return topics, hashlib.blake2b(topics, digest_size=16).digest()


def cluster_view_of(
    state: st.ControllerState,
    controllers: list[str],
    topics: tuple[bytes, bytes] | None = None,
    *,
    with_topics: bool = True,
) -> pb.ClusterView:
    """Every broker set's role and members and every topic, for brokers to answer route lookups
    while no controller does. Liveness and reported offsets are left out: they change with every
    heartbeat, and a view that changes that often would travel with every reply. `topics` is
    `topics_part(state)`, passed when the caller keeps it between topic changes; `with_topics=False`
    leaves the list out (the version still covers it), for a caller that sends it only when the
    version changed."""
    topic_list, topics_digest = topics if topics is not None else topics_part(state)
    view = pb.ClusterView(controllers=controllers)
    for name in sorted(state.broker_sets):
        bs = state.broker_sets[name]
        members = members_of(bs, None)
        for m in members:
            m.ClearField("last_epoch")
            m.ClearField("last_max_offset")
        view.broker_sets.append(
            pb.BrokerSetInfo(role=role_of(name, bs), members=members, next_broker_id=bs.next_broker_id)
        )
    digest = hashlib.blake2b(view.SerializeToString(deterministic=True), digest_size=8)
    digest.update(topics_digest)
    # never 0: a broker that holds no view names version 0
    view.version = int.from_bytes(digest.digest(), "big", signed=True) or 1
    if with_topics:
        view.MergeFromString(topic_list)
    return view


def _broker_set(state: st.ControllerState, name: str) -> st.BrokerSet:
    bs = state.broker_sets.get(name)
    if bs is None:
        raise ControllerBrokerMetadataNotExistError(f"no broker set named {name!r}", broker_set=name)
    return bs


# --- broker-facing ----------------------------------------------------------------------------


class BrokerServicer(pb_grpc.ControllerBrokerServicer):
    def __init__(self, node: ControllerNode) -> None:
        self.node = node
        # Per broker set: (the raft node's topics_changes when built, version, topics, deleted).
        # A heartbeat carries the lists only when the broker's version differs, so a cluster of
        # many topics does not rebuild and resend them every heartbeat. The version is a digest of
        # the lists, so every controller node gives the same one for the same topics (the copies a
        # broker sends to followers are answered without the lists too).
        self._topic_views: dict[str, tuple[int, str, bytes]] = {}
        # every topic, for the cluster view (broker/lookups.py), kept between topic changes
        self._view_topics: tuple[int, tuple[bytes, bytes]] | None = None

    def _topic_view(self, name: str, state: st.ControllerState) -> tuple[str, bytes]:
        """Broker set `name`'s topics and tombstones as `HeartbeatReply` bytes (`field_bytes`),
        with their version (call under `raft.read()`)."""
        changes = self.node.raft.topics_changes
        cached = self._topic_views.get(name)
        if cached is not None and cached[0] == changes:
            return cached[1], cached[2]
        topics = field_bytes(
            pb.HeartbeatReply,
            "topics",
            (topic_of(t) for t in sorted(state.topics.values(), key=lambda t: t.name) if name in t.queues),
        )
        deleted = field_bytes(
            pb.HeartbeatReply,
            "deleted_topics",
            (
                topic_of(t)
                for t in sorted(state.deleted_topics.values(), key=lambda t: t.name)
                if name in t.queues
            ),
        )
        lists = topics + deleted
        version = hashlib.blake2b(topics + b"deleted" + deleted, digest_size=12).hexdigest()
        self._topic_views[name] = (changes, version, lists)
        return version, lists

    @rpc
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBrokerReply:
        name = non_empty("broker_set", request.broker_set)
        non_empty("address", request.address)
        broker_id = non_negative("broker_id", request.broker_id) if request.HasField("broker_id") else None
        self.node.authenticate(
            context,
            "RegisterBroker",
            request,
            broker_set=name,
            broker_id=broker_id if broker_id is not None else -1,
        )
        result = await self.node.write(
            lambda now, hb: st.RegisterBroker(
                broker_set=name,
                address=request.address,
                ha_address=request.ha_address,
                datacenter=request.datacenter,
                rack=request.rack,
                identity=request.identity,
                broker_id=broker_id,
                now_ms=now,
                cluster_id=request.cluster_id,
                new_cluster_id=uuid.uuid4().hex,
            )
        )
        assigned = int(result.value)  # RegisterBroker's result carries the broker's id
        with self.node.raft.read() as state:
            role = role_of(name, state.broker_sets.get(name))
            cluster_id = state.cluster_id
        log.info(
            "broker set %s: broker %s registered at %s (master %s, epoch %d)",
            name,
            assigned,
            request.address,
            role.master_id if role.has_master else None,
            role.master_epoch,
        )
        return pb.RegisterBrokerReply(broker_id=assigned, role=role, cluster_id=cluster_id)

    @rpc
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatReply:
        name = non_empty("broker_set", request.broker_set)
        bid = non_negative("broker_id", request.broker_id)
        self.node.authenticate(context, "Heartbeat", request, broker_set=name, broker_id=bid)
        if not self.node.raft.is_leader():
            self.node.observe(name, bid, request)  # a copy (RULES.md L0); the answer names the leader
        self.node.require_leader()
        # A new leader answers from state that includes every earlier term's registrations.
        await self.node.ensure_ready()
        with self.node.raft.read() as state:
            bs = state.broker_sets.get(name)
            if bs is None or bid not in bs.members:
                raise ControllerBrokerNeedToBeRegisteredError(
                    f"broker {bid} is not registered in broker set {name!r}", broker_set=name, broker_id=bid
                )
            problem = heartbeat_problem(
                bs.master_epoch, request.epoch, request.max_offset, request.confirm_offset
            )
            if problem is not None:
                log.warning(
                    "broker set %s: refused a heartbeat of broker %d from %s: %s",
                    name,
                    bid,
                    context.peer(),
                    problem,
                )
                raise EpochRejectedError(
                    f"heartbeat of broker {bid} in {name!r}: {problem}", broker_set=name, broker_id=bid
                )
            role = role_of(name, bs)
            topics_version, topic_lists = self._topic_view(name, state)
            member = bs.members[bid]
            # RULES.md L10: what this state holds of the master's reports, and by which Raft index
            bound = (
                self.node.ack_bound(
                    name, bid, bs.master_epoch, member.last_max_offset, self.node.raft.commit_index()
                )
                if bs.master_id == bid
                else None
            )
            stale_offsets = (request.epoch, request.max_offset) != (member.last_epoch, member.last_max_offset)
            changes = self.node.raft.topics_changes
            if self._view_topics is None or self._view_topics[0] != changes:
                self._view_topics = (changes, topics_part(state))
            view_topics = self._view_topics[1]
            view = cluster_view_of(
                state, [n.grpc for n in self.node.cfg.nodes], view_topics, with_topics=False
            )
        self.node.beat(name, bid, request, report=stale_offsets)
        self.node.note_acl_version(name, bid, request.acl_version)
        unchanged = request.topics_version == topics_version
        reply = pb.HeartbeatReply(
            role=role,
            heartbeat_interval_ms=self.node.cfg.heartbeat_interval_ms,
            heartbeat_timeout_ms=self.node.cfg.heartbeat_timeout_ms,
            clean_elections_only=not self.node.cfg.enable_elect_unclean_master,
            lease_withheld=self.node.lease_withheld(name, role.master_epoch),
            rpo_bound_bytes=self.node.cfg.rpo_bound_bytes,
            ack_bound=bound,
            topics_version=topics_version,
            topics_unchanged=unchanged,
        )
        if not unchanged:
            reply.MergeFromString(topic_lists)
        # Brokers learn users and grants here: a grant reaches every broker within one heartbeat
        # interval, over a call that already proves the cluster secret, and only when it changed.
        table = self.node.acl_table()
        if table.version != request.acl_version:
            reply.acl.CopyFrom(acl_table_of(table))
        # Likewise the cluster's routes, from which the broker answers lookups while no controller
        # answers (broker/lookups.py): sent only when they changed.
        if view.version != request.cluster_version:
            reply.cluster.CopyFrom(view)
            reply.cluster.MergeFromString(view_topics[0])
        return reply

    @rpc
    async def AlterSyncStateSet(
        self, request: pb.AlterSyncStateSetRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterSyncStateSetReply:
        name = non_empty("broker_set", request.broker_set)
        master_id = non_negative("master_id", request.master_id)
        self.node.authenticate(context, "AlterSyncStateSet", request, broker_set=name, broker_id=master_id)
        non_negative("master_epoch", request.master_epoch)
        non_negative("sync_state_set_epoch", request.sync_state_set_epoch)
        check_request(len(request.new_sync_state_set) > 0, "new_sync_state_set must not be empty")
        for b in request.new_sync_state_set:
            non_negative("new_sync_state_set[]", b)
        attempt = non_negative("attempt", request.attempt)
        await self.node.write(
            lambda now, hb: st.AlterSyncStateSet(
                broker_set=name,
                master_id=master_id,
                master_epoch=request.master_epoch,
                new_sync_state_set=frozenset(request.new_sync_state_set),
                sss_epoch=request.sync_state_set_epoch,
                alive=frozenset(hb.alive(name, self.node.mono_ms())),
                now_ms=now,
                attempt=attempt,
            )
        )
        with self.node.raft.read() as state:
            role = role_of(name, state.broker_sets.get(name))
        log.info(
            "broker set %s: SyncStateSet now %s (sss epoch %d)",
            name,
            list(role.sync_state_set),
            role.sync_state_set_epoch,
        )
        return pb.AlterSyncStateSetReply(role=role)

    @rpc
    async def ElectMaster(
        self, request: pb.ElectMasterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ElectMasterReply:
        name = non_empty("broker_set", request.broker_set)
        self.node.authenticate(context, "ElectMaster", request, broker_set=name)
        bid = non_negative("broker_id", request.broker_id) if request.HasField("broker_id") else None
        check_request(not request.designated or bid is not None, "a designated election needs broker_id")
        check_request(
            not request.restarted or (bid is not None and not request.designated),
            "a restarted master's election names broker_id and is not designated",
        )
        check_request(not request.unclean or request.designated, "an unclean election must name the broker")
        # a restarted election without the epoch comes from a broker of before the field: taken,
        # unchecked (RULES.md E8), so that brokers not yet upgraded are still elected again
        check_request(
            request.restarted or request.restarted_epoch == 0,
            "restarted_epoch belongs to a restarted master's election",
        )
        check_request(request.restarted_epoch >= 0, "restarted_epoch must not be negative")
        # an operator's explicit unclean election (tide admin elect --unclean) may leave the set
        unclean = self.node.cfg.enable_elect_unclean_master or request.unclean
        self.node.require_leader()
        await self.node.ensure_ready()
        hb = self.node.heartbeats
        result = await self.node.propose_election(
            name,
            lambda wall: st.ElectMaster(
                broker_set=name,
                broker_id=bid,
                designated=request.designated,
                alive=hb.alive(name, self.node.mono_ms()),
                enable_unclean=unclean,
                now_ms=wall,
                restarted=request.restarted,
                restarted_epoch=request.restarted_epoch,
            ),
            hand_over_to=bid if request.designated else None,
        )
        if not result.ok:
            raise make_error(result.code, result.message)
        with self.node.raft.read() as state:
            role = role_of(name, state.broker_sets.get(name))
        log.info(
            "broker set %s: master %s elected on request (epoch %d)",
            name,
            role.master_id if role.has_master else None,
            role.master_epoch,
        )
        return pb.ElectMasterReply(role=role)


# --- client-facing ----------------------------------------------------------------------------


class RouteServicer(pb_grpc.ControllerRouteServicer):
    def __init__(self, node: ControllerNode) -> None:
        self.node = node

    @rpc
    async def GetRoute(
        self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteReply:
        topic = non_empty("topic", request.topic)
        alive_of = self.node.alive_ids
        with self.node.raft.read() as state:
            t = state.topics.get(topic)
            if t is None:
                raise TopicNotFoundError(f"no topic named {topic!r}", topic=topic)
            reply = pb.GetRouteReply(topic=t.name, perm=t.perm)
            for name in sorted(t.queues):
                bs = state.broker_sets.get(name)
                route = pb.BrokerSetRoute(broker_set=name, queues=t.queues[name], role=role_of(name, bs))
                if bs is not None:
                    route.replicas.extend(members_of(bs, alive_of(name)))
                reply.broker_sets.append(route)
        return reply

    @rpc
    async def DescribeBrokerSets(
        self, request: pb.DescribeBrokerSetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeBrokerSetsReply:
        for n in request.names:
            non_empty("names[]", n)
        alive_of = self.node.alive_ids
        reply = pb.DescribeBrokerSetsReply(
            liveness_known=self.node.raft.is_leader(), rpo_bound_bytes=self.node.cfg.rpo_bound_bytes
        )
        with self.node.raft.read() as state:
            names = list(request.names) or sorted(state.broker_sets)
            for name in names:
                bs = _broker_set(state, name)
                reply.broker_sets.append(
                    pb.BrokerSetInfo(
                        role=role_of(name, bs),
                        members=members_of(bs, alive_of(name)),
                        next_broker_id=bs.next_broker_id,
                    )
                )
        return reply


# --- admin ------------------------------------------------------------------------------------


class AdminServicer(pb_grpc.ControllerAdminServicer):
    def __init__(self, node: ControllerNode) -> None:
        self.node = node
        self._broker = BrokerServicer(node)
        self._names: list[str] = []  # every topic name in order, as of topics_changes == _names_at
        self._names_at = -1

    @rpc
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicReply:
        name, queues, perm = _create_args(request)
        self._check_topic_room(1)
        # a deleted name waits one heartbeat timeout: by then every master still taking writes
        # has seen the deletion and dropped the old data (broker/TOPICS.md)
        await self.node.write(
            lambda now, hb: st.CreateTopic(
                name=name,
                queues=queues,
                perm=perm,
                now_ms=now,
                recreate_after_ms=self.node.cfg.heartbeat_timeout_ms,
                retention_ms=int(request.retention_ms),
            )
        )
        with self.node.raft.read() as state:
            t = state.topics.get(name)
            topic = topic_of(t) if t is not None else pb.TopicConfig(name=name, queues=queues, perm=perm)
        log.info("topic %s created: %s (%s)", name, queues, perm)
        return pb.CreateTopicReply(topic=topic)

    @rpc
    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicsReply:
        """Several topics in one Raft commit, each created or refused on its own."""
        n = len(request.topics)
        check_request(
            0 < n <= MAX_TOPICS_PER_CREATE, f"topics must hold 1..{MAX_TOPICS_PER_CREATE} topics (got {n})"
        )
        args = [(_create_args(t), int(t.retention_ms)) for t in request.topics]
        self._check_topic_room(n)
        recreate_after = self.node.cfg.heartbeat_timeout_ms
        result = await self.node.write(
            lambda now, hb: st.CreateTopics(
                topics=tuple(
                    st.CreateTopic(
                        name=name,
                        queues=queues,
                        perm=perm,
                        now_ms=now,
                        recreate_after_ms=recreate_after,
                        retention_ms=retention,
                    )
                    for (name, queues, perm), retention in args
                )
            )
        )
        reply = pb.CreateTopicsReply()
        results = result.value if isinstance(result.value, tuple) else ()
        for ((name, _, _), _), one in zip(args, results, strict=True):
            out = reply.results.add(name=name)
            if one.ok and isinstance(one.value, st.Topic):
                out.topic.CopyFrom(topic_of(one.value))
            else:
                out.error_code, out.error_message = one.code, one.message
        log.info("%s", result.message)
        return reply

    @rpc
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicReply:
        name = non_empty("name", request.name)
        await self.node.write(lambda now, hb: st.DeleteTopic(name=name, now_ms=now))
        log.info("topic %s deleted", name)
        return pb.DeleteTopicReply()

    @rpc
    async def AlterTopicQueues(
        self, request: pb.AlterTopicQueuesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterTopicQueuesReply:
        name = non_empty("name", request.name)
        check_request(len(request.queues) > 0, "queues must name at least one broker set")
        queues = {non_empty("queues key (broker set)", k): int(v) for k, v in request.queues.items()}
        result = await self.node.write(
            lambda now, hb: st.AlterTopicQueues(name=name, queues=queues, now_ms=now)
        )
        log.info("topic %s queues: %s", name, result.value.queues)
        return pb.AlterTopicQueuesReply(topic=topic_of(result.value))

    @rpc
    async def AlterTopicRetention(
        self, request: pb.AlterTopicRetentionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterTopicRetentionReply:
        name = non_empty("name", request.name)
        retention_ms = int(request.retention_ms)
        result = await self.node.write(
            lambda now, hb: st.AlterTopicRetention(name=name, retention_ms=retention_ms, now_ms=now)
        )
        log.info("topic %s retention: %d ms (0: the brokers')", name, result.value.retention_ms)
        return pb.AlterTopicRetentionReply(topic=topic_of(result.value))

    @rpc
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsReply:
        limit = non_negative("limit", request.limit)
        prefix, after = request.prefix, request.start_after
        with self.node.raft.read() as state:
            names = self._sorted_topic_names(state)
            # the first name after `after` that may begin with `prefix` (the prefix itself may be a name)
            start = bisect.bisect_left(names, prefix) if prefix > after else bisect.bisect_right(names, after)
            page: list[str] = []
            more = False
            for name in itertools.islice(names, start, None):
                if not name.startswith(prefix):
                    break  # sorted: no later name has the prefix either
                if limit and len(page) == limit:
                    more = True
                    break
                page.append(name)
            reply = pb.ListTopicsReply(topics=[topic_of(state.topics[n]) for n in page])
        if more:
            reply.next_start_after = page[-1]
        return reply

    def _check_topic_room(self, n: int) -> None:
        """TopicLimitReachedError when `n` more topics would pass `max_topics`. Checked by the
        leader before it proposes, so creates racing each other may pass it by a few: a bound on
        memory, not an exact count."""
        limit = self.node.cfg.max_topics
        with self.node.raft.read() as state:
            held = len(state.topics)
        if held + n > limit:
            raise TopicLimitReachedError(
                f"the cluster holds {held} topics; {n} more would pass max_topics ({limit})"
            )

    def _check_metadata_room(self, key: str) -> None:
        """MetadataLimitReachedError when creating `key` would pass `max_metadata_entries`; like
        `_check_topic_room`, a bound on memory that creates racing each other may pass by a few.
        A key that exists is left to the state machine, which answers METADATA_EXISTS (what
        clients racing to create one wait for)."""
        limit = self.node.cfg.max_metadata_entries
        with self.node.raft.read() as state:
            held, exists = len(state.metadata), key in state.metadata
        if held >= limit and not exists:
            raise MetadataLimitReachedError(
                f"the controllers hold {held} metadata entries (ledgers, group assignments); "
                f"max_metadata_entries is {limit}"
            )

    def _sorted_topic_names(self, state: st.ControllerState) -> list[str]:
        """Every topic name in order, rebuilt only after the topics changed (a page is then a
        binary search and a slice, not a sort of every name)."""
        changes = self.node.raft.topics_changes
        if self._names_at != changes:
            self._names, self._names_at = sorted(state.topics), changes
        return self._names

    async def ElectMaster(
        self, request: pb.ElectMasterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ElectMasterReply:
        return await self._broker.ElectMaster(request, context)

    @rpc
    async def CleanBrokerData(
        self, request: pb.CleanBrokerDataRequest, context: grpc.aio.ServicerContext
    ) -> pb.CleanBrokerDataReply:
        name = non_empty("broker_set", request.broker_set)
        self.node.authenticate(context, "CleanBrokerData", request, broker_set=name)
        for b in request.broker_ids:
            non_negative("broker_ids[]", b)
        ids = frozenset(request.broker_ids)
        await self.node.write(
            lambda now, hb: st.CleanBrokerData(
                broker_set=name,
                broker_ids=ids,
                clean_living=request.clean_living,
                alive=frozenset(hb.alive(name, self.node.mono_ms())),
                now_ms=now,
            )
        )
        if ids:
            for b in ids:
                self.node.heartbeats.forget(name, b)
        else:
            self.node.heartbeats.forget(name)
        log.info("broker set %s: cleaned broker data %s", name, sorted(ids) or "(whole set)")
        return pb.CleanBrokerDataReply()

    @rpc
    async def PlacementAudit(
        self, request: pb.PlacementAuditRequest, context: grpc.aio.ServicerContext
    ) -> pb.PlacementAuditReply:
        """The leader's latest placement audit (RULES.md PL1-PL6), made afresh for the answer."""
        self.node.require_leader()
        await self.node.ensure_ready()
        now = self.node.mono_ms()
        violations = self.node.audit_placement(now)
        since = self.node.placement.since_ms
        reply = pb.PlacementAuditReply(
            violations=[_violation(v, now - since.get(v.key, now)) for v in violations]
        )
        for at, opened, v in self.node.placement.events:
            reply.events.append(pb.PlacementEvent(ms_ago=now - at, opened=opened, violation=_violation(v, 0)))
        for at, broker_set, key, pairs in self.node.ledger_repairs:
            reply.repairs.append(_ledger_repair(broker_set, key, pairs, now - at))
        with self.node.raft.read() as state:
            for name in sorted(set(state.broker_sets) | set(self.node.cfg.placement)):
                bs = state.broker_sets.get(name) or st.BrokerSet(name=name, members={})
                reply.required[name].datacenters.extend(self.node.required_datacenters(bs))
        return reply

    @rpc
    async def DecommissionBroker(
        self, request: pb.DecommissionBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecommissionBrokerReply:
        """Take a broker out of its set (RULES.md PL7): checked against the current state and
        liveness, then removed with CleanBrokerData."""
        name = non_empty("broker_set", request.broker_set)
        self.node.authenticate(context, "DecommissionBroker", request, broker_set=name)
        bid = non_negative("broker_id", request.broker_id)
        replacement = (
            non_negative("replacement", request.replacement) if request.HasField("replacement") else None
        )
        self.node.require_leader()
        await self.node.ensure_ready()
        for attempt in range(3):
            if await self._decommission_once(name, bid, replacement, request.force, last_try=attempt == 2):
                break
        if replacement is not None:  # PL8: its ledgers now name the replacement
            with self.node.raft.read() as state:
                ledgers = self.node.ledger_placements(state)
            await self._replace_ledger_replicas(
                name,
                {
                    lp.key: ((bid, replacement),)
                    for lp in ledgers
                    if lp.broker_set == name and bid in lp.replicas
                },
            )
        with self.node.raft.read() as state:
            return pb.DecommissionBrokerReply(role=role_of(name, state.broker_sets.get(name)))

    async def _decommission_once(
        self, name: str, bid: int, replacement: int | None, force: bool, *, last_try: bool
    ) -> bool:
        """Check PL7 (and PL8 with a replacement) against the current state, then remove the broker
        if the set did not change meanwhile. True when done; False to check again."""
        now = self.node.mono_ms()
        if not force:
            self.node.require_liveness(now)
        alive = self.node.heartbeats.alive_ids(name, now)
        with self.node.raft.read() as state:
            bs = state.broker_sets.get(name)
            if bs is None:
                raise PlacementRefusedError(f"broker set {name!r} does not exist")
            epochs = (bs.master_epoch, bs.sss_epoch)
            if replacement is not None and bid not in bs.members:
                # a retried replace whose removal went through: finish its re-replication
                problem = replacement_problem(bs, bid, replacement, alive, force=force)
                if problem is not None:
                    raise PlacementRefusedError(problem, broker_set=name, broker_id=bid)
                return True
            problem = self._decommission_problem(bs, bid, replacement, alive, force)
        if problem is not None:
            log.warning("broker set %s: refused to decommission broker %d: %s", name, bid, problem)
            raise PlacementRefusedError(problem, broker_set=name, broker_id=bid)
        try:
            await self.node.write(
                lambda now, hb, e=epochs: st.CleanBrokerData(
                    broker_set=name,
                    broker_ids=frozenset({bid}),
                    clean_living=force,
                    expect_epochs=e,
                    alive=frozenset(hb.alive(name, self.node.mono_ms())),
                    now_ms=now,
                )
            )
        except ControllerFencedSyncStateSetEpochError:
            if last_try:
                raise
            return False  # the set changed between the check and the removal: check again
        self.node.heartbeats.forget(name, bid)
        log.warning(
            "broker set %s: decommissioned broker %d%s%s",
            name,
            bid,
            f" (replaced by {replacement})" if replacement is not None else "",
            " (forced)" if force else "",
        )
        return True

    def _decommission_problem(
        self, bs: st.BrokerSet, bid: int, replacement: int | None, alive: frozenset[int], force: bool
    ) -> str | None:
        """Why broker `bid` may not leave `bs` now (PL7, and PL8 with a replacement); None: it may."""
        problem = None
        if replacement is not None:
            problem = replacement_problem(bs, bid, replacement, alive, force=force)
        if problem is None and bid in alive and not force:
            problem = f"broker {bid} of {bs.name} is still alive: stop it first, or pass --force"
        return problem or decommission_problem(
            bs, bid, self.node.required_datacenters(bs), force=force, alive=alive
        )

    @rpc
    async def RepairPlacement(
        self, request: pb.RepairPlacementRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepairPlacementReply:
        """PL8: re-replicate ledgers that name a broker which left their set, at most
        `max_ledgers` per call; then say what is left and what fixes it."""
        self.node.authenticate(context, "RepairPlacement", request)
        limit = request.max_ledgers or 100
        check_request(0 < limit <= 10_000, f"max_ledgers must be in 1..10000 (got {request.max_ledgers})")
        self.node.require_leader()
        await self.node.ensure_ready()
        now = self.node.mono_ms()
        plans: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {}
        planned = 0
        with self.node.raft.read() as state:
            for lp in self.node.ledger_placements(state):
                bs = state.broker_sets.get(lp.broker_set)
                if bs is None:
                    continue
                pairs = ledger_repair(
                    lp, bs, self.node.required_datacenters(bs), self.node.heartbeats.alive_ids(bs.name, now)
                )
                if pairs:
                    plans.setdefault(bs.name, {})[lp.key] = pairs
                    planned += 1
                    if planned >= limit:
                        break
        reply = pb.RepairPlacementReply()
        for name, repairs in sorted(plans.items()):
            for key in await self._replace_ledger_replicas(name, repairs):
                reply.repaired.append(_ledger_repair(name, key, repairs[key], 0))
        violations = self.node.audit_placement(self.node.mono_ms())
        reply.remaining.extend(_violation(v, 0) for v in violations)
        reply.advice.extend(sorted({_ADVICE[v.code] for v in violations if v.code in _ADVICE}))
        return reply

    async def _replace_ledger_replicas(
        self, broker_set: str, repairs: dict[str, tuple[tuple[int, int], ...]]
    ) -> list[str]:
        """Apply PL8 repairs in batches of 100 ledgers (one Raft command each); the keys changed."""
        changed: list[str] = []
        items = sorted(repairs.items())
        for i in range(0, len(items), 100):
            batch = tuple(items[i : i + 100])
            result = await self.node.write(
                lambda now, hb, b=batch: st.ReplaceLedgerReplicas(
                    broker_set=broker_set, repairs=b, now_ms=now
                )
            )
            changed.extend(result.value or [])
        now = self.node.mono_ms()
        for key in changed:
            self.node.ledger_repairs.append((now, broker_set, key, repairs[key]))
        if changed:
            log.warning(
                "broker set %s: re-replicated %d ledger(s) to in-sync replicas", broker_set, len(changed)
            )
        return changed

    def _check_value(self, key: str, value: bytes) -> None:
        limit = self.node.cfg.max_meta_value_bytes
        if len(value) > limit:
            raise MetadataTooLargeError(
                f"value for {key!r} is {len(value)} bytes; the limit is {limit}",
                key=key,
                size=len(value),
                limit=limit,
            )

    @rpc
    async def MetaCreate(
        self, request: pb.MetaCreateRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetaEntry:
        key = non_empty("key", request.key, MAX_KEY_LEN)
        value = bytes(request.value)
        self._check_value(key, value)
        self._check_metadata_room(key)
        await self.node.write(lambda now, hb: st.MetaCreate(key=key, value=value, now_ms=now))
        return self._entry(key)

    @rpc
    async def MetaGet(self, request: pb.MetaGetRequest, context: grpc.aio.ServicerContext) -> pb.MetaEntry:
        key = non_empty("key", request.key, MAX_KEY_LEN)
        return self._entry(key)

    @rpc
    async def MetaCompareAndSet(
        self, request: pb.MetaCompareAndSetRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetaEntry:
        key = non_empty("key", request.key, MAX_KEY_LEN)
        non_negative("expected_version", request.expected_version)
        value = bytes(request.value)
        self._check_value(key, value)
        proof = _ledger_password_hash(request)
        result = await self.node.write(
            lambda now, hb: st.MetaCompareAndSet(
                key=key,
                value=value,
                expected_version=request.expected_version,
                now_ms=now,
                ledger_password_hash=proof,
            )
        )
        if isinstance(result.value, st.MetaEntry):
            return meta_of(result.value)
        return self._entry(key)

    @rpc
    async def MetaDelete(
        self, request: pb.MetaDeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetaDeleteReply:
        key = non_empty("key", request.key, MAX_KEY_LEN)
        expected = (
            non_negative("expected_version", request.expected_version)
            if request.HasField("expected_version")
            else None
        )
        proof = _ledger_password_hash(request)
        await self.node.write(
            lambda now, hb: st.MetaDelete(
                key=key, expected_version=expected, now_ms=now, ledger_password_hash=proof
            )
        )
        return pb.MetaDeleteReply()

    @rpc
    async def MetaList(
        self, request: pb.MetaListRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetaListReply:
        check_request(len(request.prefix) <= MAX_KEY_LEN, f"prefix is longer than {MAX_KEY_LEN} characters")
        check_request(
            len(request.start_after) <= MAX_KEY_LEN, f"start_after is longer than {MAX_KEY_LEN} characters"
        )
        check_request(0 <= request.limit <= MAX_META_PAGE, f"limit must be in 0..{MAX_META_PAGE} (0: all)")
        with self.node.raft.read() as state:
            entries, nxt = state.list_page(request.prefix, request.start_after, request.limit)
            return pb.MetaListReply(entries=[meta_of(e) for e in entries], next_start_after=nxt)

    @rpc
    async def ClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatusReply:
        s = self.node.raft.status()
        return pb.ClusterStatusReply(
            node_id=s.node_id,
            raft_state=s.raft_state,
            leader_id=s.leader_id or "",
            leader_address=self.node.raft.leader_grpc() or "",
            term=s.term,
            commit_index=s.commit_index,
            last_applied=s.last_applied,
            ready=s.ready,
            brokers_heard=self.node.heartbeats.heard(self.node.mono_ms()),
            nodes=[
                pb.ControllerNodeInfo(id=n.id, raft_address=n.raft, grpc_address=n.grpc)
                for n in self.node.cfg.nodes
            ],
            cluster_epoch=self.node.raft.cluster_epoch,
            members=self.node.raft.members(),
        )

    # --- users and grants (controller/users.py); the guard lets only cluster admins here ---

    @rpc
    async def CreateUser(
        self, request: pb.CreateUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateUserReply:
        name = non_empty("name", request.name)
        try:
            # wrapped before it enters the Raft log: the journal and snapshots never hold a key
            # that signs without the cluster secret (tidelog/access.py)
            stored = access.wrap_signing_key(
                self.node.secret, request.access_key, request.signing_key, secrets.token_bytes(16)
            )
        except ValueError:
            raise InvalidArgumentError(
                "a signing key is 64 lower-case hex digits (tidelog.access.signing_key)"
            ) from None
        result = await self.node.write(
            lambda now, hb: st.CreateUser(
                name=name, access_key=request.access_key, signing_key=stored, now_ms=now
            )
        )
        log.warning("user %s created (access key %s)", name, request.access_key)
        behind = await self.node.wait_acl_applied()
        return pb.CreateUserReply(user=user_of(result.value, with_key=False), not_yet_applied=behind)

    @rpc
    async def DeleteUser(
        self, request: pb.DeleteUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteUserReply:
        name = non_empty("name", request.name)
        await self.node.write(lambda now, hb: st.DeleteUser(name=name, now_ms=now))
        log.warning("user %s deleted", name)
        return pb.DeleteUserReply(not_yet_applied=await self.node.wait_acl_applied())

    @rpc
    async def ListUsers(
        self, request: pb.ListUsersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListUsersReply:
        table = self.node.acl_table()
        return pb.ListUsersReply(users=[user_of(table.users[n], with_key=False) for n in sorted(table.users)])

    @rpc
    async def GrantAcl(
        self, request: pb.GrantAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.GrantAclReply:
        g = request.grant
        await self.node.write(
            lambda now, hb: st.GrantAcl(g.user, g.kind, g.pattern, g.permission, now_ms=now)
        )
        log.warning("granted %s on %s %s to %s", g.permission, g.kind, g.pattern, g.user)
        return pb.GrantAclReply(not_yet_applied=await self.node.wait_acl_applied())

    @rpc
    async def RevokeAcl(
        self, request: pb.RevokeAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeAclReply:
        g = request.grant
        await self.node.write(
            lambda now, hb: st.RevokeAcl(g.user, g.kind, g.pattern, g.permission, now_ms=now)
        )
        log.warning("revoked %s on %s %s from %s", g.permission, g.kind, g.pattern, g.user)
        return pb.RevokeAclReply(not_yet_applied=await self.node.wait_acl_applied())

    @rpc
    async def ListAcls(
        self, request: pb.ListAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAclsReply:
        table = self.node.acl_table()
        grants = [g for g in sorted(table.grants) if not request.user or g.user == request.user]
        return pb.ListAclsReply(grants=[grant_of(g) for g in grants])

    def _entry(self, key: str) -> pb.MetaEntry:
        with self.node.raft.read() as state:
            entry = state.metadata.get(key)
            if entry is None:
                raise MetadataNotFoundError(f"no metadata under {key!r}", key=key)
            return meta_of(entry)


def add_to_server(server: grpc.aio.Server, node: ControllerNode) -> None:
    pb_grpc.add_ControllerBrokerServicer_to_server(BrokerServicer(node), server)
    pb_grpc.add_ControllerRouteServicer_to_server(RouteServicer(node), server)
    pb_grpc.add_ControllerAdminServicer_to_server(AdminServicer(node), server)
