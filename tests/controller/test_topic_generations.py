"""Topic generations and tombstones in the controller state (RULES.md T3): every created topic
gets a generation from a counter that only grows, a deleted one leaves a tombstone, a deleted
name is created again only after `recreate_after_ms`, and all of it survives a snapshot."""

from __future__ import annotations

import json

from tests.controller.test_state_rules import A, mastered, refused
from tidelog.controller.state import ControllerState, CreateTopic, DeleteTopic
from tidelog.errors import TopicDeletionPendingError, by_code


def test_generations_grow_and_a_recreated_topic_is_a_new_one() -> None:
    s = mastered()
    assert s.apply(CreateTopic("a", {A: 1}, now_ms=10)).value.generation == 1
    assert s.apply(CreateTopic("b", {A: 1}, now_ms=10)).value.generation == 2
    assert s.apply(DeleteTopic("a", now_ms=20)).ok
    tomb = s.deleted_topic("a")
    assert tomb is not None and (tomb.generation, tomb.deleted_ms, tomb.queues) == (1, 20, {A: 1})
    # the same name again: refused until recreate_after_ms has passed since the deletion
    r = refused(s, CreateTopic("a", {A: 2}, now_ms=1019, recreate_after_ms=1000), "TOPIC_DELETION_PENDING")
    assert isinstance(r.error(), TopicDeletionPendingError) and by_code(r.code).retryable
    assert "in 1 ms" in r.message
    again = s.apply(CreateTopic("a", {A: 2}, now_ms=1020, recreate_after_ms=1000))
    assert again.ok and again.value.generation == 3
    assert s.deleted_topic("a") is None, "a created topic has no tombstone"
    s.check_invariants()


def test_a_failed_create_takes_no_generation() -> None:
    s = mastered()
    refused(s, CreateTopic("x", {"nope": 1}), "CONTROLLER_BROKER_METADATA_NOT_EXIST")
    assert s.apply(CreateTopic("x", {A: 1})).value.generation == 1


def test_generations_and_tombstones_survive_a_snapshot() -> None:
    s = mastered()
    s.apply(CreateTopic("a", {A: 1}, now_ms=1))
    s.apply(CreateTopic("b", {A: 1}, now_ms=1))
    s.apply(DeleteTopic("a", now_ms=5))
    restored = ControllerState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert restored == s
    assert restored.apply(CreateTopic("c", {A: 1})).value.generation == 3
    assert refused(
        restored, CreateTopic("a", {A: 1}, now_ms=6, recreate_after_ms=10), "TOPIC_DELETION_PENDING"
    )


def test_a_snapshot_from_before_generations_loads_with_generation_0() -> None:
    s = mastered()
    s.apply(CreateTopic("old", {A: 1}, now_ms=1))
    d = json.loads(json.dumps(s.to_dict()))
    del d["next_topic_generation"], d["deleted_topics"]
    for t in d["topics"]:
        del t["generation"], t["deleted_ms"]
    restored = ControllerState.from_dict(d)
    assert restored.topic("old").generation == 0, "its data is never dropped by a generation"
    assert restored.apply(CreateTopic("new", {A: 1})).value.generation == 1
