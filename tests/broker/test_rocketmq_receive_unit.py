"""The RocketMQ endpoint's receive when the broker set's master has not yet heard of a topic that
the controller's route already names (a topic just created: brokers learn topics at their next
heartbeat). Unit level: the endpoint's calls to the cluster go to a stand-in transport, so that
the order of the two events is fixed rather than raced (the process tests meet it by chance)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidelog.broker.config import from_mapping
from tidelog.broker.rocketmq import MessagingService
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.errors import TopicNotFoundError
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto.rocketmq import service_pb2 as s

BASE = {"broker_set": "a", "data_dir": "data", "controllers": "127.0.0.1:1", "secret": "s"}
SET_B = BrokerSetRoute(name="b", queues=2, master_address="127.0.0.1:2", master_epoch=1, replicas=())


class Transport:
    """What the endpoint asks of the cluster: a route naming set b, and the masters' answers in turn."""

    rpc_timeout = 1.0

    def __init__(self, answers: list[Exception | bpb.SharedReceiveReply], topic_exists: list[bool]) -> None:
        self.answers = answers
        self.topic_exists = topic_exists  # the controller's answer to each route lookup, in turn
        self.calls = 0
        self.forgotten = 0

    async def route(self, topic: str) -> TopicRoute:
        exists = self.topic_exists.pop(0) if len(self.topic_exists) > 1 else self.topic_exists[0]
        if not exists:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        return TopicRoute.build(topic, [SET_B])

    async def call_master(self, topic: str, bs: BrokerSetRoute, method: str, req: Any, timeout: float) -> Any:
        assert method == "SharedReceive"
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        await asyncio.sleep(req.wait_ms / 1000)  # a long poll that finds nothing
        return answer

    def forget_route(self, topic: str) -> None:
        self.forgotten += 1


class Members:
    def seen(self, group: str, client_id: str, topics: list[str]) -> None:
        pass


class Context:
    def time_remaining(self) -> float:
        return 10.0

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", "client-1"),)


def endpoint(transport: Transport) -> MessagingService:
    svc = MessagingService(from_mapping(BASE), lambda: "127.0.0.1:3")
    svc.client = transport  # type: ignore[assignment]
    svc.members = Members()  # type: ignore[assignment]
    svc._dlq_ready.add("g")  # noqa: SLF001 (the dead-letter topic is another call's concern)
    return svc


def request() -> s.ReceiveMessageRequest:
    req = s.ReceiveMessageRequest(batch_size=8)
    req.group.name = "g"
    req.message_queue.topic.name = "t"
    req.message_queue.broker.name = "b"
    req.long_polling_timeout.FromMilliseconds(1000)
    return req


def not_heard() -> TopicNotFoundError:
    return TopicNotFoundError("topic 't' has no queues in broker set b")


def test_a_master_that_has_not_heard_of_a_topic_yet_gets_asked_again_not_reported_missing() -> None:
    transport = Transport([not_heard(), bpb.SharedReceiveReply(records=b"", crc=0)], [True])
    svc = endpoint(transport)
    got = asyncio.run(svc._receive(request(), Context()))  # type: ignore[arg-type]  # noqa: SLF001
    assert got == []  # an empty receive, as after a long poll: the client asks again
    assert transport.calls >= 2  # asked the master again within the same receive (load may fit a third)
    assert transport.forgotten == 1  # and looked the route up afresh once, after the refusal


def test_a_topic_the_controller_no_longer_has_is_reported_missing() -> None:
    # the master does not know the topic and the fresh lookup says it was deleted
    transport = Transport([not_heard()], [True, False])
    svc = endpoint(transport)
    with pytest.raises(TopicNotFoundError):
        asyncio.run(svc._receive(request(), Context()))  # type: ignore[arg-type]  # noqa: SLF001
    assert transport.calls == 1
