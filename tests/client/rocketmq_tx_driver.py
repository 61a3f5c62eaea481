"""Drives the official RocketMQ Python client's delayed and transactional messages against a
broker's RocketMQ endpoint, in its own process (as tests/client/rocketmq_driver.py, whose client
configuration it shares). Prints one JSON document.

    python rocketmq_tx_driver.py ENDPOINT delay-receive TOPIC GROUP QUIET_S DELAY_S...
    python rocketmq_tx_driver.py ENDPOINT recall TOPIC QUIET_S
    python rocketmq_tx_driver.py ENDPOINT transactions TOPIC GROUP QUIET_S
    python rocketmq_tx_driver.py ENDPOINT end-raw TOPIC OTHER_TOPIC
    python rocketmq_tx_driver.py ENDPOINT keep DELAY_TOPIC DELAY_S TX_TOPIC BODY
    python rocketmq_tx_driver.py ENDPOINT answer-and-receive TX_TOPIC GROUP EXPECTED QUIET_S TOPIC...

Each receiving command stops once what it waits for came, after a quiet period (QUIET_S) in
which a message that must not come (a second copy, a recalled or rolled-back one) would have
come; a bound keeps a run that never sees it from waiting forever.

The client sends `delivery_timestamp` as whole seconds (it writes the value into the
Timestamp's seconds), so delivery times here are whole seconds since the epoch.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
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
from rocketmq_driver import RECEIVERS, config, together  # noqa: E402  (a sibling script, run as a file)

#: How long a receiving command runs at most, beyond what it waits for (a loaded machine).
BOUND_S = 60.0


def consumer_of(endpoint: str, group: str, topics: list[str]) -> SimpleConsumer:
    """A started SimpleConsumer of `topics` (every tag), long polls of 1 s."""
    subscriptions = {t: FilterExpression("*") for t in topics}
    consumer = SimpleConsumer(config(endpoint), group, subscriptions, await_duration=1)
    consumer.startup()
    return consumer


def receive_until(
    consumer: SimpleConsumer,
    done: Callable[[list[dict[str, Any]]], bool],
    quiet_s: float,
    bound_s: float,
    errors: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Receive and acknowledge, RECEIVERS receives at once (a receive waits on one broker set of
    one topic: several at once, a message in any set is taken as it comes), until `done` holds
    for what came, then `quiet_s` more; at most `bound_s` in all. Every message, with the
    wall-clock time it arrived. Given `errors`, a receive that fails is made again, its error
    noted there (a failover under way); without, it fails the run."""
    got: list[dict[str, Any]] = []
    lock = threading.Lock()
    hard = time.monotonic() + bound_s
    quiet_until: list[float] = []  # set once, by the receiver that first sees `done` hold

    def receiver() -> None:
        while time.monotonic() < hard:
            with lock:
                if not quiet_until and done(got):
                    quiet_until.append(time.monotonic() + quiet_s)
                if quiet_until and time.monotonic() >= quiet_until[0]:
                    return
            try:
                batch = consumer.receive(32, 15)
            except Exception as exc:
                # noted, for the test to say whether the endpoint let a failover reach the
                # application (it answers empty receives while a new master takes its role)
                if errors is None:
                    raise
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                time.sleep(0.2)
                continue
            for m in batch:
                seen = {
                    "id": m.message_id,
                    "topic": m.topic,
                    "body": m.body.decode(),
                    "keys": sorted(m.keys),
                    "attempt": m.delivery_attempt,
                    "at": time.time(),
                }
                consumer.ack(m)
                with lock:
                    got.append(seen)

    together(RECEIVERS, receiver)
    return got


def delay_send(producer: Producer, topic: str, delays: list[float]) -> dict[str, Any]:
    """Send one DELAY message per delay (seconds from now, rounded up to a whole second), then
    one 41 days ahead (refused: what it was answered)."""
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


def delay_receive(
    endpoint: str, topic: str, group: str, quiet_s: float, delays: list[float]
) -> dict[str, Any]:
    """`delay_send` the `delays`, and receive until each sent message came and `quiet_s` more."""
    consumer = consumer_of(endpoint, group, [topic])
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        out = delay_send(producer, topic, delays)
        ids = {s["id"] for s in out["sent"]}
        due = max(s["at"] for s in out["sent"]) - time.time()
        got = receive_until(consumer, lambda got: ids <= {m["id"] for m in got}, quiet_s, due + BOUND_S)
        return {**out, "received": got}
    finally:
        producer.shutdown()
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

    def bodies(self) -> set[str]:
        with self.lock:
            return {c["body"] for c in self.checks}


def transactions(endpoint: str, topic: str, group: str, quiet_s: float) -> dict[str, Any]:
    """Four half messages: one committed, one rolled back, two left to the checker (it commits
    "orphan-commit", rolls back "orphan-rollback"). A consumer of `group` receives until both
    orphans were checked and the two committed messages came, then `quiet_s` more (the
    producer stays as long, for its checker's answers and any further check)."""
    checker = Checker()
    consumer = consumer_of(endpoint, group, [topic])
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

        def done(got: list[dict[str, Any]]) -> bool:
            came = {m["body"] for m in got}
            return {"orphan-commit", "orphan-rollback"} <= checker.bodies() and {
                "commit",
                "orphan-commit",
            } <= came

        out["received"] = receive_until(consumer, done, quiet_s, BOUND_S)
        with checker.lock:
            out["checks"] = list(checker.checks)
        return out
    finally:
        producer.shutdown()
        consumer.shutdown()


def half_send(producer: Producer, topic: str, body: str) -> dict[str, Any]:
    """Send one half message and leave it without an end."""
    m = Message()
    m.topic = topic
    m.body = body.encode()
    r = producer.send(m, producer.begin_transaction())
    return {"id": r.message_id, "transaction_id": r.transaction_id, "sent_at": time.time()}


def keep(endpoint: str, delay_topic: str, delay_s: float, tx_topic: str, body: str) -> dict[str, Any]:
    """One half message of `tx_topic` with `body`, left without an end, then one DELAY message
    `delay_s` ahead (`delay_send`, so that it is sent last: it is the one with a deadline); the
    producer leaves."""
    producer = Producer(config(endpoint), (tx_topic, delay_topic), Checker())
    producer.startup()
    try:
        half = half_send(producer, tx_topic, body)
        return {**delay_send(producer, delay_topic, [delay_s]), "half": half}
    finally:
        producer.shutdown()


def answer_and_receive(
    endpoint: str, tx_topic: str, group: str, expected: int, quiet_s: float, topics: list[str]
) -> dict[str, Any]:
    """A producer of `tx_topic` that answers checks (`Checker`) and a consumer of `group` on
    `topics`, receiving until `expected` messages came and `quiet_s` more. The messages, the
    checks, and the errors of receives made again (a failover under way)."""
    checker = Checker()
    consumer = consumer_of(endpoint, group, topics)
    producer = Producer(config(endpoint), (tx_topic,), checker)
    producer.startup()
    try:
        errors: list[str] = []
        got = receive_until(consumer, lambda got: len(got) >= expected, quiet_s, BOUND_S, errors)
        with checker.lock:
            return {"received": got, "checks": list(checker.checks), "receive_errors": errors}
    finally:
        producer.shutdown()
        consumer.shutdown()


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


def recall(endpoint: str, topic: str, quiet_s: float) -> dict[str, Any]:
    """Two DELAY messages 3 s ahead: the first recalled at once (recall_message), the second
    recalled once it was due and received by a consumer. A consumer receives until the second
    came and both were due, and `quiet_s` more (the recalled one would have come by then). The
    ids, and what each recall answered."""
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    consumer = consumer_of(endpoint, "g-recall", [topic])
    try:
        sent = []
        for i in range(2):
            m = Message()
            m.topic = topic
            m.body = f"recall-{i}".encode()
            at = int(time.time()) + 3
            m.delivery_timestamp = at
            r = producer.send(m)
            sent.append({"id": r.message_id, "handle": r.recall_handle, "at": at})
        first = producer.recall_message(topic, sent[0]["handle"])
        due = max(s["at"] for s in sent)

        def done(got: list[dict[str, Any]]) -> bool:
            return time.time() >= due and sent[1]["id"] in {m["id"] for m in got}

        received = [m["id"] for m in receive_until(consumer, done, quiet_s, due - time.time() + BOUND_S)]
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
    if command == "delay-receive":
        out = delay_receive(endpoint, args[0], args[1], float(args[2]), [float(a) for a in args[3:]])
    elif command == "recall":
        out = recall(endpoint, args[0], float(args[1]))
    elif command == "transactions":
        out = transactions(endpoint, args[0], args[1], float(args[2]))
    elif command == "keep":
        out = keep(endpoint, args[0], float(args[1]), args[2], args[3])
    elif command == "answer-and-receive":
        out = answer_and_receive(endpoint, args[0], args[1], int(args[2]), float(args[3]), args[4:])
    else:
        out = end_raw(endpoint, args[0], args[1])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
