"""Growing a topic's queues in the controller state (controller/RULES.md T5): counts only go up,
the generation stays, refusals change nothing."""

from __future__ import annotations

import json

import pytest

from tests.controller.test_state_rules import A, mastered, refused
from tidelog.controller.state import AlterTopicQueues, ControllerState, CreateTopic
from tidelog.errors import TopicQueuesShrinkError

B = "broker-b"


def with_topic() -> ControllerState:
    s = mastered()
    assert s.apply(CreateTopic("t", {A: 4}, now_ms=1)).ok
    return s


@pytest.mark.parametrize(
    ("queues", "code"),
    [
        ({A: 3}, "TOPIC_QUEUES_SHRINK"),
        ({A: 0}, "INVALID_ARGUMENT"),
        ({A: -1}, "INVALID_ARGUMENT"),
        ({A: 10**9}, "INVALID_ARGUMENT"),
        ({A: "8"}, "INVALID_ARGUMENT"),
        ({}, "INVALID_ARGUMENT"),
        ({"../etc": 8}, "INVALID_ARGUMENT"),
        ({B: 2}, "CONTROLLER_BROKER_METADATA_NOT_EXIST"),
    ],
)
def test_refusals_change_nothing(queues: dict, code: str) -> None:
    refused(with_topic(), AlterTopicQueues("t", queues, now_ms=2), code)


def test_an_unknown_topic_is_refused() -> None:
    refused(with_topic(), AlterTopicQueues("nope", {A: 8}), "TOPIC_NOT_FOUND")


def test_a_shrink_is_a_typed_error_that_says_why() -> None:
    r = with_topic().apply(AlterTopicQueues("t", {A: 2}))
    err = r.error()
    assert isinstance(err, TopicQueuesShrinkError)
    assert "4 queues" in r.message and "only go up" in r.message


def test_growing_keeps_the_generation_and_survives_a_snapshot() -> None:
    s = with_topic()
    gen = s.topic("t").generation
    r = s.apply(AlterTopicQueues("t", {A: 8}, now_ms=3))
    assert r.ok and r.changed and r.value.queues == {A: 8} and r.value.generation == gen
    assert s.route("t").brokers[0].queues == 8
    restored = ControllerState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert restored == s and restored.topic("t").queues == {A: 8}


def test_the_same_counts_again_is_ok_and_changes_nothing() -> None:
    s = with_topic()
    r = s.apply(AlterTopicQueues("t", {A: 4}))
    assert r.ok and not r.changed and r.value.queues == {A: 4}
