"""Drives the official RocketMQ Python client's delayed and transactional messages against a
broker's RocketMQ endpoint, in its own process (as tests/client/rocketmq_driver.py, whose client
configuration it shares). Prints one JSON document.

    python rocketmq_tx_driver.py ENDPOINT delay-send TOPIC DELAY_S...
    python rocketmq_tx_driver.py ENDPOINT recall TOPIC
    python rocketmq_tx_driver.py ENDPOINT receive TOPIC GROUP EXPECTED SECONDS
    python rocketmq_tx_driver.py ENDPOINT transactions TOPIC STAY_S
    python rocketmq_tx_driver.py ENDPOINT end-raw TOPIC OTHER_TOPIC
    python rocketmq_tx_driver.py ENDPOINT half-send TOPIC BODY
    python rocketmq_tx_driver.py ENDPOINT answer-checks TOPIC STAY_S

The client sends `delivery_timestamp` as whole seconds (it writes the value into the
Timestamp's seconds), so delivery times here are whole seconds since the epoch.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer, TransactionChecker
from rocketmq.grpc_protocol import (
    Code,
    EndTransactionRequest,
    MessageType,
    MessagingServiceStub,
    SendMessageRequest,
    TransactionResolution,
    TransactionSource,
)

sys.path.insert(0, str(Path(__file__).parent))
from rocketmq_driver import config  # noqa: E402  (a sibling script, run as a file)


def delay_send(endpoint: str, topic: str, delays: list[float]) -> dict[str, Any]:
    """Send one DELAY message per delay (seconds from now, rounded up to a whole second)."""
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        sent = []
        for i, delay in enumerate(delays):
            m = Message()
            m.topic = topic
            m.body = f"delayed-{i}".encode()
            m.tag = "d"
            m.keys = f"dk-{i}"
            at = int(time.time() + delay) + 1
            m.delivery_timestamp = at
            r = producer.send(m)
            sent.append({"i": i, "id": r.message_id, "at": at, "sent": time.time()})
        m = Message()
        m.topic = topic
        m.body = b"too-far"
        m.delivery_timestamp = int(time.time()) + 41 * 24 * 3600  # RocketMQ's bound is 40 days
        try:
            producer.send(m)
            too_far = "sent"
        except Exception as exc:
            too_far = str(exc)
        return {"sent": sent, "too_far": too_far}
    finally:
        producer.shutdown()


def receive(endpoint: str, topic: str, group: str, expected: int, seconds: float) -> dict[str, Any]:
    """Receive and acknowledge for `seconds` (at least until `expected` messages came), with the
    wall-clock time each arrived."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        hard = time.monotonic() + seconds + 60
        while time.monotonic() < hard and (time.monotonic() < deadline or len(got) < expected):
            for m in consumer.receive(32, 15):
                got.append(
                    {
                        "id": m.message_id,
                        "body": m.body.decode(),
                        "keys": sorted(m.keys),
                        "attempt": m.delivery_attempt,
                        "at": time.time(),
                    }
                )
                consumer.ack(m)
        return {"received": got}
    finally:
        consumer.shutdown()


class Checker(TransactionChecker):
    """Answers COMMIT for bodies starting with "orphan-commit", ROLLBACK otherwise; records each check."""

    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        body = message.body.decode()
        with self.lock:
            self.checks.append({"body": body, "id": message.message_id, "at": time.time()})
        if body.startswith("orphan-commit"):
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


def transactions(endpoint: str, topic: str, stay_s: float) -> dict[str, Any]:
    """Four half messages: one committed, one rolled back, two left to the checker (it commits
    "orphan-commit", rolls back "orphan-rollback"); the producer stays `stay_s` for the checks."""
    checker = Checker()
    producer = Producer(config(endpoint), (topic,), checker)
    producer.startup()
    try:
        out: dict[str, Any] = {}
        for body in ("commit", "rollback", "orphan-commit", "orphan-rollback"):
            m = Message()
            m.topic = topic
            m.body = body.encode()
            m.keys = f"tk-{body}"
            transaction = producer.begin_transaction()
            r = producer.send(m, transaction)
            out[body] = {"id": r.message_id, "transaction_id": r.transaction_id}
            if body == "commit":
                transaction.commit()
            elif body == "rollback":
                transaction.rollback()
        out["sent_at"] = time.time()
        time.sleep(stay_s)
        with checker.lock:
            out["checks"] = list(checker.checks)
        return out
    finally:
        producer.shutdown()


def half_send(endpoint: str, topic: str, body: str) -> dict[str, Any]:
    """Send one half message and leave without ending it."""
    producer = Producer(config(endpoint), (topic,), Checker())
    producer.startup()
    try:
        m = Message()
        m.topic = topic
        m.body = body.encode()
        r = producer.send(m, producer.begin_transaction())
        return {"id": r.message_id, "transaction_id": r.transaction_id, "sent_at": time.time()}
    finally:
        producer.shutdown()


def answer_checks(endpoint: str, topic: str, stay_s: float) -> dict[str, Any]:
    """A producer of `topic` that only answers checks, for `stay_s`."""
    checker = Checker()
    producer = Producer(config(endpoint), (topic,), checker)
    producer.startup()
    try:
        time.sleep(stay_s)
        with checker.lock:
            return {"checks": list(checker.checks)}
    finally:
        producer.shutdown()


def end_raw(endpoint: str, topic: str, other_topic: str) -> dict[str, Any]:
    """Codes of EndTransaction calls that name no open transaction of their topic, and of one
    that does (a half message sent by a producer without a checker's answers)."""
    producer = Producer(config(endpoint), (topic,), Checker())
    producer.startup()
    try:
        m = Message()
        m.topic = topic
        m.body = b"raw-half"
        r = producer.send(m, producer.begin_transaction())
    finally:
        producer.shutdown()

    def end(name: str, txid: str, resolution: int = TransactionResolution.COMMIT) -> str:
        request = EndTransactionRequest()
        request.topic.name = name
        request.message_id = r.message_id
        request.transaction_id = txid
        request.resolution = resolution
        request.source = TransactionSource.SOURCE_CLIENT
        with grpc.insecure_channel(endpoint) as channel:
            return str(
                Code.Name(MessagingServiceStub(channel).EndTransaction(request, timeout=10).status.code)
            )

    def send(message_type: int, delivery_s: int = 0, group: str = "") -> str:
        request = SendMessageRequest()
        m = request.messages.add()
        m.topic.name = topic
        m.body = b"raw-send"
        m.system_properties.message_id = "raw"
        m.system_properties.message_type = message_type
        if delivery_s:
            m.system_properties.delivery_timestamp.seconds = delivery_s
        if group:
            m.system_properties.message_group = group
        with grpc.insecure_channel(endpoint) as channel:
            return str(Code.Name(MessagingServiceStub(channel).SendMessage(request, timeout=10).status.code))

    broker_set = r.transaction_id.split(":")[0]
    now = int(time.time())
    return {
        "delay_without_time": send(MessageType.DELAY),
        "normal_with_time": send(MessageType.NORMAL, now + 60),
        "transaction_with_time": send(MessageType.TRANSACTION, now + 60),
        "transaction_with_group": send(MessageType.TRANSACTION, group="g"),
        "delay_too_far": send(MessageType.DELAY, now + 41 * 24 * 3600),
        "id": r.message_id,
        "not_an_id": end(topic, "nonsense"),
        "unknown": end(topic, f"{broker_set}:tx:fffffff"),
        "wrong_topic": end(other_topic, r.transaction_id),
        "rollback": end(topic, r.transaction_id, TransactionResolution.ROLLBACK),
        "again_commit": end(topic, r.transaction_id),
        "again_rollback": end(topic, r.transaction_id, TransactionResolution.ROLLBACK),
    }


def recall(endpoint: str, topic: str) -> dict[str, Any]:
    """Two DELAY messages 3 s ahead: the first recalled at once (recall_message), the second
    recalled once it was due and received by a consumer. The ids, and what each recall answered."""
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    consumer = SimpleConsumer(config(endpoint), "g-recall", {topic: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        sent = []
        for i in range(2):
            m = Message()
            m.topic = topic
            m.body = f"recall-{i}".encode()
            m.delivery_timestamp = int(time.time()) + 3
            r = producer.send(m)
            sent.append({"id": r.message_id, "handle": r.recall_handle})
        first = producer.recall_message(topic, sent[0]["handle"])
        received: list[str] = []
        deadline = time.monotonic() + 10  # both due after 3 s: well past it
        while time.monotonic() < deadline:
            for got in consumer.receive(32, 15):
                consumer.ack(got)
                received.append(got.message_id)
        try:
            late = f"recalled {producer.recall_message(topic, sent[1]['handle'])}"
        except Exception as exc:
            late = str(exc)
        return {"sent": sent, "first": first, "received": received, "late": late}
    finally:
        consumer.shutdown()
        producer.shutdown()


def main() -> None:
    endpoint, command, *args = sys.argv[1:]
    if command == "delay-send":
        out = delay_send(endpoint, args[0], [float(a) for a in args[1:]])
    elif command == "receive":
        out = receive(endpoint, args[0], args[1], int(args[2]), float(args[3]))
    elif command == "recall":
        out = recall(endpoint, args[0])
    elif command == "transactions":
        out = transactions(endpoint, args[0], float(args[1]))
    elif command == "half-send":
        out = half_send(endpoint, args[0], args[1])
    elif command == "answer-checks":
        out = answer_checks(endpoint, args[0], float(args[1]))
    else:
        out = end_raw(endpoint, args[0], args[1])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
