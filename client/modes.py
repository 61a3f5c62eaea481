"""Subscription modes of a consumer group (pure; time passed in).

A member of a consumer group names its mode; the members reading one topic under one group name
must agree on it:

- `clustering` (the default): the live members share the topic's queues (client/handover.py).
- `failover`: one member, the *active* one, reads every queue; the others are standbys. The active
  member holds the group's active key, `group/<group>/active/<topic>` in the controller's metadata
  store, whose value is its member id. A standby takes the key when it is free (the active member
  closed and deleted it) or when its holder's session expired, then takes the queues over through
  the same owner keys as clustering: a clean hand-over delivers nothing twice, a crash re-delivers
  at most what the dead member had not committed.
- `exclusive`: like failover, but a second member is refused (SubscriptionConflictError) instead of
  waiting.
- `broadcast`: every member reads every queue, with its own offsets and owner keys, kept under the
  group name `<group>@<member id>`: a member that restarts under the same member id resumes where
  it stopped; a new member id starts from the consumer's `start`.
- `shared`: no member owns a queue; any member receives any message, acknowledges each one, and an
  unacknowledged message comes back after its invisible duration, to the group's dead-letter topic
  `%DLQ%<group>` after `max_delivery_attempts` deliveries (the broker keeps that state in the log:
  broker/shared.py, broker/sharedstate.py).
- `key_shared`: like shared, but the messages of one key go out one at a time, in order: the next
  message of a key is handed out (to whichever member asks) once the previous one is acknowledged
  or dead, so no two members ever hold messages of one key at once.

A member whose mode differs from that of a live member that announced itself earlier is refused:
the first mode in a group stays until its last member leaves. "Earlier" is the first announcement's
time, then the member id, so that two members starting together agree on who is refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from tidelog.commitlog.consumequeue import DEAD_LETTER_PREFIX

CLUSTERING = "clustering"
BROADCAST = "broadcast"
EXCLUSIVE = "exclusive"
FAILOVER = "failover"
SHARED = "shared"
KEY_SHARED = "key_shared"
MODES = (CLUSTERING, BROADCAST, EXCLUSIVE, FAILOVER, SHARED, KEY_SHARED)
#: The modes in which no member owns a queue: each message is received and acknowledged.
PER_MESSAGE = (SHARED, KEY_SHARED)
#: The queue of a shared receive that reads every queue of its topic on one broker set at once: one
#: long poll per broker set instead of one per queue (RocketMQ's pop of queue id -1).
ANY_QUEUE = -1
#: The modes in which one active member reads everything.
SINGLE_ACTIVE = (EXCLUSIVE, FAILOVER)

ACTIVE_KEY = "group/{group}/active/{topic}"


def active_key(group: str, topic: str) -> str:
    return ACTIVE_KEY.format(group=group, topic=topic)


#: The properties of a message moved to the group's dead-letter topic (shared mode).
ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
ORIGIN_QUEUE = "DLQ_ORIGIN_QUEUE"
ORIGIN_OFFSET = "DLQ_ORIGIN_OFFSET"
ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
DELIVERY_ATTEMPTS = "DLQ_DELIVERY_ATTEMPTS"


#: Bounds of the shared modes, the same for the broker, the client and the RocketMQ endpoint: messages
#: (or receipts) of one receive or acknowledgement, an invisible duration, deliveries of a message.
MAX_RECEIVE = 1024
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_ATTEMPTS = 1000


def dlq_topic(group: str) -> str:
    return f"{DEAD_LETTER_PREFIX}{group}"


def state_group(group: str, mode: str, member_id: str) -> str:
    """The group name under which a member keeps its owner keys and committed offsets."""
    return f"{group}@{member_id}" if mode == BROADCAST else group


@dataclass(frozen=True)
class Announced:
    """What a live member's announcement says about it."""

    mode: str
    since_ms: int  # the time of its first announcement


def conflict(me: str, mine: Announced, live: Mapping[str, Announced]) -> str | None:
    """The id of a live member that makes `me` give way (another mode, announced earlier), or None."""
    rank = (mine.since_ms, me)
    for member, seen in sorted(live.items()):
        if member != me and seen.mode != mine.mode and (seen.since_ms, member) < rank:
            return member
    return None


Action = Literal["create", "replace", "hold", "wait", "refuse"]


@dataclass(frozen=True)
class Decision:
    """What a member of a single-active mode does with the active key this round.

    create: the key is free: create it (another member may be quicker: then wait).
    replace: its holder's session expired: compare-and-set it at `version`.
    hold: this member holds it: it is the active member.
    wait: a live member holds it (failover): stay a standby.
    refuse: a live member holds it (exclusive): this member is refused.
    """

    action: Action
    holder: str | None = None
    version: int | None = None


def decide_active(me: str, mode: str, holder: tuple[str, int] | None, live: Collection[str]) -> Decision:
    """The active-key decision for member `me` given the key's holder (member id, key version)."""
    if holder is None:
        return Decision("create")
    member, version = holder
    if member == me:
        return Decision("hold", member, version)
    if member not in live:
        return Decision("replace", member, version)
    return Decision("refuse" if mode == EXCLUSIVE else "wait", member, version)


def sharing(mode: str, me: str, live: Collection[str], active: str | None) -> list[str]:
    """The members among which the topic's queues are shared, as `handover.plan` takes them:
    every live member (clustering), this member alone (broadcast: its own owner keys), or the
    active member alone (failover, exclusive; nobody while no member holds the active key), or
    nobody (shared, key_shared: no member owns a queue)."""
    if mode in PER_MESSAGE:
        return []
    if mode == CLUSTERING:
        return sorted(live)
    if mode == BROADCAST:
        return [me]
    return [active] if active is not None else []
