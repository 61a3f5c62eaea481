"""`TopicAdmin.describe_topic` right after a topic's creation: its brokers learn the topic from
their next heartbeat's answer, so a TOPIC_NOT_FOUND from them within the propagation window is
asked again, and so is a slave's TOPIC_GENERATION_PENDING while the master's generation marker is
on its way; a broker set that does not answer (UNAVAILABLE) is the caller's at once (a stand-in
transport: the cluster tests cover the real one)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.client import topicadmin
from tidelog.client.topicadmin import TopicAdmin
from tidelog.errors import TidelogError, TopicGenerationPendingError, TopicNotFoundError, UnavailableError


class _Transport:
    def __init__(self, misses: int, miss: type[TidelogError] = TopicNotFoundError) -> None:
        self.misses = misses
        self.miss = miss
        self.asked = 0

    async def route(self, name: str, refresh: bool = False) -> Any:
        return SimpleNamespace(broker_sets=[SimpleNamespace(name="broker-a", queues=2)])

    async def queue_offsets(self, bs: Any, topic: str, queue: int) -> Any:
        self.asked += 1
        if self.misses > 0:
            self.misses -= 1
            raise self.miss(f"no topic {topic!r} here yet")
        return SimpleNamespace(min=0, max=0, confirmed=0)


def test_a_topic_its_brokers_learn_a_moment_later_is_described() -> None:
    transport = _Transport(misses=3)
    rows = asyncio.run(TopicAdmin(transport).describe_topic("new"))  # type: ignore[arg-type]
    assert [(r["queue"], r["max"]) for r in rows] == [(0, 0), (1, 0)]
    assert transport.asked == 5


def test_a_topic_its_brokers_never_learn_is_still_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topicadmin, "TOPIC_PROPAGATION_S", 0.3)
    with pytest.raises(TopicNotFoundError):
        asyncio.run(TopicAdmin(_Transport(misses=10**6)).describe_topic("gone"))  # type: ignore[arg-type]


def test_a_slave_still_waiting_for_the_generation_marker_is_asked_again() -> None:
    transport = _Transport(misses=2, miss=TopicGenerationPendingError)
    rows = asyncio.run(TopicAdmin(transport).describe_topic("new"))  # type: ignore[arg-type]
    assert [(r["queue"], r["max"]) for r in rows] == [(0, 0), (1, 0)]
    assert transport.asked == 4


def test_a_broker_set_that_does_not_answer_is_unavailable_at_once() -> None:
    """`tide top` describes every topic each second: a set that is down shows at once."""
    transport = _Transport(10**6, UnavailableError)
    with pytest.raises(UnavailableError):
        asyncio.run(TopicAdmin(transport).describe_topic("down"))  # type: ignore[arg-type]
    assert transport.asked == 1
