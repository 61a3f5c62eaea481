"""A topic's own retention in the controller state (controller/topics.py, docs/ARCHITECTURE.md §6.4):
set at creation or by AlterTopicRetention, validated (0 = the brokers', else one second to ten
years), refusals change nothing, it survives a snapshot, and old snapshots and journaled
commands without it read as 0."""

from __future__ import annotations

import json
import pickle

import pytest

from tests.controller.test_state_rules import A, mastered, refused
from tidelog.controller.state import AlterTopicRetention, ControllerState, CreateTopic, DeleteTopic

DAY = 86_400_000


def with_topic(retention_ms: int = 0) -> ControllerState:
    s = mastered()
    assert s.apply(CreateTopic("t", {A: 4}, now_ms=1, retention_ms=retention_ms)).ok
    return s


@pytest.mark.parametrize(
    ("name", "cmd", "code"),
    [
        ("negative", AlterTopicRetention("t", -1), "INVALID_ARGUMENT"),
        ("under a second", AlterTopicRetention("t", 999), "INVALID_ARGUMENT"),
        ("over ten years", AlterTopicRetention("t", 3651 * DAY), "INVALID_ARGUMENT"),
        ("not an int", AlterTopicRetention("t", "1h"), "INVALID_ARGUMENT"),  # type: ignore[arg-type]
        ("a bool", AlterTopicRetention("t", True), "INVALID_ARGUMENT"),  # type: ignore[arg-type]
        ("a bad name", AlterTopicRetention("../t", 1000), "INVALID_ARGUMENT"),
        ("no such topic", AlterTopicRetention("nope", 1000), "TOPIC_NOT_FOUND"),
        ("created with a bad one", CreateTopic("u", {A: 1}, retention_ms=5), "INVALID_ARGUMENT"),
    ],
)
def test_refusals_change_nothing(name: str, cmd: object, code: str) -> None:
    r = refused(with_topic(), cmd, code)
    assert code != "INVALID_ARGUMENT" or "retention_ms" in r.message or "name" in r.message


@pytest.mark.parametrize(
    ("created", "altered", "changed"),
    [
        (0, 3000, True),  # from the brokers' to its own
        (3000, 0, True),  # back to the brokers'
        (3000, 7 * DAY, True),
        (3000, 3000, False),  # the same again: OK, nothing changes
        (0, 0, False),
        (0, 1000, True),  # the bounds are accepted
        (0, 3650 * DAY, True),
    ],
)
def test_alter_sets_it(created: int, altered: int, changed: bool) -> None:
    s = with_topic(created)
    assert s.topic("t").retention_ms == created
    gen, queues = s.topic("t").generation, dict(s.topic("t").queues)
    r = s.apply(AlterTopicRetention("t", altered, now_ms=2))
    assert r.ok and r.changed == changed and r.value.retention_ms == altered
    t = s.topic("t")
    assert (t.retention_ms, t.generation, t.queues) == (altered, gen, queues)  # only the retention moves


def test_it_survives_a_snapshot_and_a_deletion_forgets_it() -> None:
    s = with_topic(3000)
    restored = ControllerState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert restored == s and restored.topic("t").retention_ms == 3000
    assert restored.apply(DeleteTopic("t", now_ms=5)).ok
    assert restored.apply(CreateTopic("t", {A: 1}, now_ms=10)).value.retention_ms == 0


def test_a_snapshot_from_before_topic_retention_reads_0() -> None:
    d = json.loads(json.dumps(with_topic(3000).to_dict()))
    for t in d["topics"]:
        del t["retention_ms"]
    assert ControllerState.from_dict(d).topic("t").retention_ms == 0


def test_a_journaled_create_from_before_topic_retention_unpickles_with_0() -> None:
    cmd = CreateTopic("t", {A: 1}, now_ms=1)
    # a command pickled before the field existed has no value for it in its state
    raw = pickle.dumps(cmd).replace(b"retention_ms", b"retention_xx")
    old = pickle.loads(raw)
    del old.__dict__["retention_xx"]
    assert old.retention_ms == 0
    assert mastered().apply(old).value.retention_ms == 0
    # and the new command pickles under the path the journal names
    assert type(pickle.loads(pickle.dumps(AlterTopicRetention("t", 1000)))) is AlterTopicRetention
