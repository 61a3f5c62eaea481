"""Topics in the controller state (RULES.md §6): creating, growing and deleting them, and the
route a topic's name resolves to.

Topics have a generation: a number from a counter that only grows, given to each topic when it
is created, so a topic deleted and created again under the same name is a different topic to
the brokers, which drop the data of older generations (broker/TOPICS.md). A deleted topic
leaves a tombstone (its name, generation, broker sets and deletion time): brokers learn from
it that the data must go, and a topic of that name can be created again only
``recreate_after_ms`` after the deletion (the service passes the broker heartbeat timeout), so
that every master still taking writes has seen the tombstone before the new topic exists.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

from tidelog.commitlog.consumequeue import user_topic_problem

from .commands import AlterTopicQueues, AlterTopicRetention, CreateTopic, CreateTopics, DeleteTopic, Result
from .model import (
    MAX_QUEUES_PER_BROKER_SET,
    MAX_TOPIC_RETENTION_MS,
    MIN_TOPIC_RETENTION_MS,
    TOPIC_PERMS,
    QueueRoute,
    Route,
    StateData,
    Topic,
)
from .validation import Outcome, Reject, bad, is_int, need_name, need_nonneg

#: The commands that change `topics` or `deleted_topics`, and only they: the controller re-derives
#: the topic lists it sends with heartbeats after one of these is applied (controller/raft.py).
TOPIC_COMMANDS: frozenset[type] = frozenset(
    {CreateTopic, CreateTopics, AlterTopicQueues, AlterTopicRetention, DeleteTopic}
)
#: The most topics one CreateTopics may carry (one Raft entry; the service refuses more).
MAX_TOPICS_PER_CREATE = 1000


def _check_queue_counts(queues: object) -> None:
    if not isinstance(queues, Mapping) or not queues:
        raise bad("queues must map at least one broker set name to a queue count")
    for name, count in queues.items():
        need_name(name, "broker set name")
        if not is_int(count) or not 1 <= count <= MAX_QUEUES_PER_BROKER_SET:
            raise bad(f"queue count for {name} must be 1..{MAX_QUEUES_PER_BROKER_SET}, got {count!r}")


def _check_retention(retention_ms: object) -> None:
    """0 (the brokers' retention), or one second up to ten years: a shorter one would cut a
    topic's queues faster than the retention rounds run, a longer one is a typo."""
    if not is_int(retention_ms) or not (
        retention_ms == 0 or MIN_TOPIC_RETENTION_MS <= retention_ms <= MAX_TOPIC_RETENTION_MS
    ):
        raise bad(
            f"retention_ms must be 0 (the brokers' retention) or "
            f"{MIN_TOPIC_RETENTION_MS}..{MAX_TOPIC_RETENTION_MS}, got {retention_ms!r}"
        )


def _check_create_args(c: CreateTopic) -> None:
    need_name(c.name, "topic name")
    if (problem := user_topic_problem(c.name)) is not None:
        raise bad(problem)
    _check_queue_counts(c.queues)
    if c.perm not in TOPIC_PERMS:
        raise bad(f"perm must be one of {TOPIC_PERMS}, got {c.perm!r}")
    need_nonneg(c.now_ms, "now_ms")
    need_nonneg(c.recreate_after_ms, "recreate_after_ms")
    _check_retention(c.retention_ms)


def _check_creatable(s: StateData, c: CreateTopic) -> None:
    if c.name in s.topics:
        raise Reject("TOPIC_EXISTS", f"topic {c.name} already exists")
    for name in sorted(c.queues):
        if name not in s.broker_sets:
            raise Reject(
                "CONTROLLER_BROKER_METADATA_NOT_EXIST", f"topic {c.name} names unknown broker set {name}"
            )
    tomb = s.deleted_topics.get(c.name)
    if tomb is not None and c.now_ms - tomb.deleted_ms < c.recreate_after_ms:
        wait = tomb.deleted_ms + c.recreate_after_ms - c.now_ms
        raise Reject(
            "TOPIC_DELETION_PENDING",
            f"topic {c.name} was deleted {c.now_ms - tomb.deleted_ms} ms ago; "
            f"it can be created again in {wait} ms, once every broker has dropped its data",
        )


def create_topic(s: StateData, c: CreateTopic) -> Outcome:
    _check_create_args(c)
    _check_creatable(s, c)
    t = Topic(
        name=c.name,
        queues=dict(sorted(c.queues.items())),
        perm=c.perm,
        created_ms=c.now_ms,
        generation=s.next_topic_generation,
        retention_ms=c.retention_ms,
    )
    s.next_topic_generation += 1
    s.deleted_topics.pop(c.name, None)
    s.topics[c.name] = t
    return Result(value=copy.deepcopy(t), changed=True, message=f"topic {c.name} created"), None


def create_topics(s: StateData, c: CreateTopics) -> Outcome:
    """Each topic as `create_topic` would, in order; the value is one Result per topic."""
    if not isinstance(c.topics, tuple) or not all(isinstance(t, CreateTopic) for t in c.topics):
        raise bad("topics must be a tuple of CreateTopic")
    if not 0 < len(c.topics) <= MAX_TOPICS_PER_CREATE:
        raise bad(f"a CreateTopics carries 1..{MAX_TOPICS_PER_CREATE} topics, got {len(c.topics)}")
    results: list[Result] = []
    for one in c.topics:
        try:
            results.append(create_topic(s, one)[0])
        except Reject as rej:
            results.append(Result(rej.code, rej.message, rej.value))
    changed = any(r.changed for r in results)
    created = sum(r.ok for r in results)
    return Result(
        value=tuple(results), changed=changed, message=f"{created} of {len(results)} topics created"
    ), None


def alter_topic_queues(s: StateData, c: AlterTopicQueues) -> Outcome:
    """Grow a topic's queues (RULES.md T5): counts only go up, since a queue that went away would take its
    messages and the groups' committed offsets with it. The generation stays: the brokers keep
    the topic's data and serve the new queues from their next heartbeat. Messages sent by key
    may land in another queue afterwards (the key hash is taken modulo the queue count)."""
    need_name(c.name, "topic name")
    _check_queue_counts(c.queues)
    need_nonneg(c.now_ms, "now_ms")
    t = s.topics.get(c.name)
    if t is None:
        raise Reject("TOPIC_NOT_FOUND", f"no topic {c.name}")
    for name in sorted(c.queues):
        if name not in s.broker_sets:
            raise Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"no broker set {name}")
        if c.queues[name] < t.queues.get(name, 0):
            raise Reject(
                "TOPIC_QUEUES_SHRINK",
                f"topic {c.name} has {t.queues[name]} queues in {name}; "
                f"they can only go up, not down to {c.queues[name]}",
            )
    grown = {**t.queues, **c.queues}
    if grown == t.queues:
        return Result(value=copy.deepcopy(t), message=f"topic {c.name} already has these queues"), None
    t = s.topics[c.name] = dataclasses.replace(t, queues=dict(sorted(grown.items())))
    return Result(value=copy.deepcopy(t), changed=True, message=f"topic {c.name} now has {t.queues}"), None


def alter_topic_retention(s: StateData, c: AlterTopicRetention) -> Outcome:
    """Set how long a topic's messages stay readable (0: the brokers' own retention_ms). The
    brokers apply it from their next heartbeat and retention round (docs/ARCHITECTURE.md §6.4);
    messages already cut from a topic's queues by a shorter retention stay cut."""
    need_name(c.name, "topic name")
    _check_retention(c.retention_ms)
    need_nonneg(c.now_ms, "now_ms")
    t = s.topics.get(c.name)
    if t is None:
        raise Reject("TOPIC_NOT_FOUND", f"no topic {c.name}")
    if t.retention_ms == c.retention_ms:
        return Result(value=copy.deepcopy(t), message=f"topic {c.name} already has this retention"), None
    t = s.topics[c.name] = dataclasses.replace(t, retention_ms=c.retention_ms)
    shown = f"{c.retention_ms} ms" if c.retention_ms else "the brokers' retention"
    return Result(value=copy.deepcopy(t), changed=True, message=f"topic {c.name} retention is {shown}"), None


def delete_topic(s: StateData, c: DeleteTopic) -> Outcome:
    need_name(c.name, "topic name")
    need_nonneg(c.now_ms, "now_ms")
    if c.name not in s.topics:
        raise Reject("TOPIC_NOT_FOUND", f"no topic {c.name}")
    t = dataclasses.replace(s.topics.pop(c.name), deleted_ms=c.now_ms)
    s.deleted_topics[c.name] = t
    return Result(changed=True, message=f"topic {c.name} deleted"), None


def route(s: StateData, topic: str) -> Route | None:
    """Topic -> its broker sets with the recorded master and replicas; None if no such topic.
    A broker set that is not (or no longer) registered appears with no master and no replicas."""
    t = s.topics.get(topic)
    if t is None:
        return None
    parts = []
    for name in sorted(t.queues):
        bs = s.broker_sets.get(name)
        master = bs.master if bs else None
        parts.append(
            QueueRoute(
                broker_set=name,
                queues=t.queues[name],
                master_id=master.broker_id if master else None,
                master_address=master.address if master else None,
                master_epoch=bs.master_epoch if bs else 0,
                replicas=tuple((i, bs.members[i].address) for i in sorted(bs.members)) if bs else (),
            )
        )
    return Route(topic=t.name, perm=t.perm, brokers=tuple(parts))
