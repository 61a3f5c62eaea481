"""Drives the official RocketMQ Python client (rocketmq-python-client, unmodified) against a
broker's RocketMQ endpoint, in its own process: its generated modules and tidelog's register the
same protobuf names, so the two cannot share one process. Prints one JSON document.

    python rocketmq_driver.py ENDPOINT send TOPIC COUNT ASYNC_COUNT
    python rocketmq_driver.py ENDPOINT receive TOPIC GROUP EXPECTED FILTER [IDLE [AWAIT_S]]
    python rocketmq_driver.py ENDPOINT redeliver TOPIC GROUP
    python rocketmq_driver.py ENDPOINT raw TOPIC [OTHER_ENDPOINT]
    python rocketmq_driver.py ENDPOINT signed TOPIC GROUP ACCESS_KEY SECRET_KEY
    python rocketmq_driver.py ENDPOINT unsigned TOPIC SECRET_KEY_OF_ak
    python rocketmq_driver.py ENDPOINT forward TOPIC GROUP [INVISIBLE_S [QUIET_S]]
    python rocketmq_driver.py ENDPOINT push TOPIC GROUP EXPECTED FAIL_EVERY QUIET_S [HOLD_S]
    python rocketmq_driver.py ENDPOINT ack-all TOPIC GROUP EXPECTED
    python rocketmq_driver.py ENDPOINT produce-consume TOPIC GROUP SECONDS READY_FILE [STOP_FILE PROGRESS_FILE]
    python rocketmq_driver.py ENDPOINT hold TOPIC GROUP SECONDS READY_FILE
    python rocketmq_driver.py ENDPOINT fifo-send TOPIC GROUPS PER_GROUP
    python rocketmq_driver.py ENDPOINT fifo-receive TOPIC GROUP EXPECTED ACK_FIRST HOLD INVISIBLE_S [AWAIT_S]
    python rocketmq_driver.py ENDPOINT change-invisible TOPIC GROUP FIRST_S LONGER_S
    python rocketmq_driver.py ENDPOINT tls TOPIC GROUP COUNT
    python rocketmq_driver.py ENDPOINT wake TOPIC GROUP COUNT [PAUSE_S]

`tls` connects with TLS (the client's `tls_enable`), trusting the roots gRPC trusts by default:
the system's, or the file GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names.
"""

from __future__ import annotations

import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from hashlib import sha1
from typing import Any

import grpc
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import (
    AckMessageRequest,
    Code,
    EndTransactionRequest,
    ForwardMessageToDeadLetterQueueRequest,
    MessagingServiceStub,
    QueryRouteRequest,
    TelemetryCommand,
)

IN_FLIGHT = 256  # async sends outstanding at once
RECEIVERS = 4  # receives outstanding at once (receive, ack-all): more than a topic's broker sets


def config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials("ak", "sk"), request_timeout=10)


def message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = f"body-{i}".encode()
    m.tag = ("a", "b", "c")[i % 3]
    m.keys = f"key-{i}"
    m.add_property("seq", str(i))
    return m


def send(endpoint: str, topic: str, count: int, async_count: int) -> dict[str, Any]:
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        sent = []
        for i in range(count):
            r = producer.send(message(topic, i))
            sent.append({"i": i, "id": r.message_id, "offset": r.offset})
        # at most IN_FLIGHT outstanding: beyond the client's request timeout, a send still
        # queued in the client is cancelled
        window = threading.Semaphore(IN_FLIGHT)
        futures = []
        for i in range(count, count + async_count):
            window.acquire()
            f = producer.send_async(message(topic, i))
            f.add_done_callback(lambda _f: window.release())
            futures.append((i, f))
        for i, f in futures:
            r = f.result(timeout=60)
            sent.append({"i": i, "id": r.message_id, "offset": r.offset})
        errors = []
        try:
            producer.send(message(f"{topic}-missing", 0))
        except Exception as exc:
            errors.append(str(exc))
        return {"sent": sent, "unknown_topic_errors": errors}
    finally:
        producer.shutdown()


def described(m: Any) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "body": m.body.decode(),
        "tag": m.tag,
        "keys": sorted(m.keys),
        "properties": dict(m.properties),
        "attempt": m.delivery_attempt,
    }


def together(receivers: int, work: Callable[[], None]) -> None:
    """Run `work` on `receivers` threads at once; raise the first error one of them raised.

    A receive reads every queue of the one broker set it names (the client takes the sets in
    turn) and waits out its long poll (`await_duration`) when that set has nothing: several at
    once, one set's messages come while a receive of a drained set waits."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(receivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def receive(
    endpoint: str,
    topic: str,
    group: str,
    expected: int,
    expression: str,
    idle_rounds: int = 3,
    await_s: int = 2,
) -> dict[str, Any]:
    """A SimpleConsumer acknowledging what it receives, RECEIVERS receives at once (`together`),
    until `expected` messages came and then each receiver's last `idle_rounds` receives came back
    empty (each a long poll of `await_s`)."""
    consumer = SimpleConsumer(
        config(endpoint), group, {topic: FilterExpression(expression)}, await_duration=await_s
    )
    consumer.startup()
    try:
        got: list[dict[str, Any]] = []
        lock = threading.Lock()
        deadline = time.monotonic() + 60

        def receiver() -> None:
            idle = 0
            while time.monotonic() < deadline:
                with lock:
                    if len(got) >= expected and idle >= idle_rounds:
                        return
                batch = consumer.receive(32, 15)
                idle = 0 if batch else idle + 1
                for m in batch:
                    consumer.ack(m)
                    with lock:
                        got.append(described(m))

        together(RECEIVERS, receiver)
        return {"received": got}
    finally:
        consumer.shutdown()


def redeliver(endpoint: str, topic: str, group: str, invisible_s: int = 2) -> dict[str, Any]:
    """Receive one message with an `invisible_s` invisible duration (0: the request names none,
    and the endpoint chooses, as for a push consumer), leave it unacknowledged, receive it again."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        rounds = []
        deadline = time.monotonic() + 40
        while len(rounds) < 2 and time.monotonic() < deadline:
            for m in consumer.receive(1, invisible_s):  # the client omits a duration of 0
                rounds.append({**described(m), "at": time.monotonic()})
                if len(rounds) == 2:
                    consumer.ack(m)
        return {"rounds": rounds}
    finally:
        consumer.shutdown()


def raw(endpoint: str, topic: str, other: str = "") -> dict[str, Any]:
    """Status codes of malformed or unserved calls, through the client's own generated stub; the
    route as the client asks for it, and as asked through two addresses (`endpoint;other`)."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = MessagingServiceStub(channel)
        route = QueryRouteRequest()
        route.topic.name = f"{topic}-missing"
        bad_name = QueryRouteRequest()
        bad_name.topic.name = "no spaces allowed"
        ack = AckMessageRequest()
        ack.group.name = "g"
        ack.topic.name = topic
        entry = ack.entries.add()
        entry.message_id = "x"
        entry.receipt_handle = "not-a-handle"
        ok_route = QueryRouteRequest()
        ok_route.topic.name = topic
        routed = stub.QueryRoute(ok_route, timeout=10)
        both = QueryRouteRequest()
        both.topic.name = topic
        both.endpoints.scheme = 1  # IPv4
        for address in (endpoint, other):
            host, _, port = address.rpartition(":")
            both.endpoints.addresses.add(host=host, port=int(port))
        routed_both = stub.QueryRoute(both, timeout=10) if other else None
        return {
            "unknown_topic": Code.Name(stub.QueryRoute(route, timeout=10).status.code),
            "bad_topic_name": Code.Name(stub.QueryRoute(bad_name, timeout=10).status.code),
            "bad_receipt": Code.Name(stub.AckMessage(ack, timeout=10).entries[0].status.code),
            "end_transaction": Code.Name(
                stub.EndTransaction(EndTransactionRequest(), timeout=10).status.code
            ),
            "route": [
                {
                    "broker": q.broker.name,
                    "broker_id": q.broker.id,
                    "queue": q.id,
                    "endpoints": [f"{a.host}:{a.port}" for a in q.broker.endpoints.addresses],
                }
                for q in routed.message_queues
            ],
            "route_of_two": [
                [f"{a.host}:{a.port}" for a in q.broker.endpoints.addresses]
                for q in (routed_both.message_queues if routed_both is not None else [])
            ],
        }


def signed(endpoint: str, topic: str, group: str, ak: str, sk: str) -> dict[str, Any]:
    """Send one message with these credentials and receive it back; what failed, if anything."""
    cfg = ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)
    try:
        producer = Producer(cfg, (topic,))
        producer.startup()
        try:
            sent = producer.send(message(topic, 0)).message_id
        finally:
            producer.shutdown()
    except Exception as exc:
        return {"send_error": f"{type(exc).__name__}: {exc}"}
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in consumer.receive(1, 10):
                consumer.ack(m)
                return {"sent": sent, "received": m.message_id}
        return {"sent": sent, "received": None}
    finally:
        consumer.shutdown()


def signature(secret: str, when: datetime) -> list[tuple[str, str]]:
    """The metadata the clients sign a call with, written out here so its time can be chosen."""
    at = when.strftime("%Y%m%dT%H%M%SZ")
    sig = hmac.new(secret.encode(), at.encode(), sha1).hexdigest()
    auth = f"MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature={sig}"
    return [("x-mq-date-time", at), ("authorization", auth)]


def unsigned(endpoint: str, topic: str, secret: str) -> dict[str, Any]:
    """Codes of raw calls: unsigned, signed too long ago, and signed now (by access key `ak`)."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = MessagingServiceStub(channel)
        route = QueryRouteRequest()
        route.topic.name = topic
        now = datetime.now(UTC)

        def code(metadata: list[tuple[str, str]]) -> str:
            return str(Code.Name(stub.QueryRoute(route, timeout=10, metadata=metadata).status.code))

        hello = TelemetryCommand()
        hello.settings.client_type = 1  # PRODUCER
        replies = stub.Telemetry(iter([hello]), timeout=10)
        return {
            "query_route": code([]),
            "query_route_old": code(signature(secret, now - timedelta(minutes=20))),
            "query_route_wrong": code(signature(secret + "x", now)),
            "query_route_signed": code(signature(secret, now)),
            "telemetry": [Code.Name(r.status.code) for r in replies],
        }


def forward(
    endpoint: str, topic: str, group: str, invisible_s: int = 30, quiet_s: float = 6
) -> dict[str, Any]:
    """Receive one message with the SimpleConsumer (which has no call for it; invisible for
    `invisible_s`), send it to the dead-letter queue with the client's own generated stub, then
    try its receipt again and receive for `quiet_s`: the message must not come back (with
    `quiet_s` past `invisible_s`, not even once its invisible time has run out)."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, invisible_s)
        (m,) = got
        request = ForwardMessageToDeadLetterQueueRequest()
        request.group.name = group
        request.topic.name = topic
        request.receipt_handle = m.receipt_handle
        request.message_id = m.message_id
        request.delivery_attempt = m.delivery_attempt
        request.max_delivery_attempts = 16
        with grpc.insecure_channel(endpoint) as channel:
            stub = MessagingServiceStub(channel)
            first = stub.ForwardMessageToDeadLetterQueue(request, timeout=15).status
            again = stub.ForwardMessageToDeadLetterQueue(request, timeout=15).status
        later = []
        deadline = time.monotonic() + quiet_s
        while time.monotonic() < deadline:
            later += [described(x) for x in consumer.receive(32, 1)]
        return {
            "message": described(m),
            "forward": Code.Name(first.code),
            "forward_message": first.message,
            "again": Code.Name(again.code),
            "later": later,
        }
    finally:
        consumer.shutdown()


class Recorder(MessageListener):
    """A push consumer's listener: records every delivery (with its time, and when its
    processing ended), takes `hold_s` over each, and fails the messages whose `seq` property is
    a multiple of `fail_every` (0: none)."""

    def __init__(self, fail_every: int, hold_s: float = 0.0) -> None:
        self.fail_every = fail_every
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.deliveries: list[dict[str, Any]] = []

    def consume(self, message: Any) -> ConsumeResult:
        seen = {**described(message), "at": time.monotonic()}
        with self.lock:
            self.deliveries.append(seen)
        time.sleep(self.hold_s)
        with self.lock:
            seen["done"] = time.monotonic()
        seq = int(message.properties.get("seq", "1"))
        failing = self.fail_every and seq % self.fail_every == 0
        return ConsumeResult.FAILURE if failing else ConsumeResult.SUCCESS

    def ids(self) -> set[str]:
        with self.lock:
            return {d["id"] for d in self.deliveries}


def push(
    endpoint: str, topic: str, group: str, expected: int, fail_every: int, quiet_s: float, hold_s: float = 0.0
) -> dict[str, Any]:
    """A PushConsumer until `expected` distinct messages were delivered and then nothing was for
    `quiet_s` seconds (at most two minutes): every delivery, in order."""
    listener = Recorder(fail_every, hold_s)
    consumer = PushConsumer(config(endpoint), group, listener, {topic: FilterExpression("*")})
    consumer.startup()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.2)
            with listener.lock:
                last = listener.deliveries[-1]["at"] if listener.deliveries else None
            if len(listener.ids()) >= expected and last is not None and time.monotonic() - last >= quiet_s:
                break
        with listener.lock:
            return {"deliveries": list(listener.deliveries)}
    finally:
        consumer.shutdown()


def ack_all(endpoint: str, topic: str, group: str, expected: int) -> dict[str, Any]:
    """A SimpleConsumer receiving (32 at a time, RECEIVERS receives at once: `together`) until
    `expected` messages came and then each receiver's next receive came back empty,
    acknowledging each message from a pool of threads (concurrent acknowledgements of a queue
    share one replicated write; the client's ack_async returns no future to check): the
    messages (id, body, delivery attempt) and how many acknowledgements failed."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        got: list[list[Any]] = []
        acks: list[Future[None]] = []
        lock = threading.Lock()
        deadline = time.monotonic() + 300  # a busy machine: the test says how long it took
        with ThreadPoolExecutor(16) as pool:

            def receiver() -> None:
                while time.monotonic() < deadline:
                    # invisible for 2 minutes: on a loaded machine the pool may take longer than
                    # half a minute to acknowledge a batch, and a receipt handle that expired
                    # before its ack is a failed ack, not what this drive checks
                    batch = consumer.receive(32, 120)
                    with lock:
                        if not batch and len(got) >= expected:
                            return
                        for m in batch:
                            acks.append(pool.submit(consumer.ack, m))
                            got.append([m.message_id, m.body.decode(), m.delivery_attempt])

            together(RECEIVERS, receiver)
            failed = sum(1 for f in acks if f.exception() is not None)
        return {"received": got, "ack_failures": failed}
    finally:
        consumer.shutdown()


def produce_consume(
    endpoint: str,
    topic: str,
    group: str,
    seconds: float,
    ready_file: str,
    stop_file: str = "",
    progress_file: str = "",
) -> dict[str, Any]:
    """A producer sending numbered messages one at a time for `seconds` (or until STOP_FILE
    exists) while a PushConsumer consumes them; then the consumer runs until it saw every
    receipted message (at most a minute more). Writes READY_FILE once both run, so that a fault
    can be timed after it, and the count of receipts to PROGRESS_FILE after each. Receipts carry
    `epochMs` too, the time on the test's clock. With DRIVER_TLS set, both connect with TLS."""
    tls = bool(os.environ.get("DRIVER_TLS"))
    listener = Recorder(0)
    consumer = PushConsumer(config(endpoint), group, listener, {topic: FilterExpression("*")}, tls_enable=tls)
    consumer.startup()
    producer = Producer(config(endpoint), (topic,), tls_enable=tls)
    producer.startup()
    receipts: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        with open(ready_file, "w") as f:
            f.write("ready\n")
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < seconds and not (stop_file and os.path.exists(stop_file)):
            try:
                r = producer.send(message(topic, i))
                receipts.append(
                    {"i": i, "id": r.message_id, "at": time.monotonic() - t0, "epochMs": time.time() * 1000}
                )
                if progress_file:
                    with open(progress_file + ".new", "w") as f:
                        f.write(str(len(receipts)))
                    os.replace(progress_file + ".new", progress_file)
            except Exception as exc:
                failures.append(f"{time.monotonic() - t0:.1f}s {type(exc).__name__}: {str(exc)[:200]}")
                time.sleep(0.2)
            i += 1
        wanted = {r["id"] for r in receipts}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not wanted <= listener.ids():
            time.sleep(0.2)
        time.sleep(2)  # redeliveries of what was acknowledged just before the end
        with listener.lock:
            deliveries = [[d["id"], d["body"], d["attempt"]] for d in listener.deliveries]
        return {"receipts": receipts, "deliveries": deliveries, "send_failures": failures}
    finally:
        producer.shutdown()
        consumer.shutdown()


def hold(endpoint: str, topic: str, group: str, seconds: float, ready_file: str) -> dict[str, Any]:
    """A PushConsumer that runs for `seconds`, then shuts down; writes its client id to
    READY_FILE once started."""
    consumer = PushConsumer(config(endpoint), group, Recorder(0), {topic: FilterExpression("*")})
    consumer.startup()
    try:
        with open(ready_file, "w") as f:
            f.write(consumer.client_id)
        time.sleep(seconds)
    finally:
        consumer.shutdown()
    return {"client_id": consumer.client_id}


def fifo_send(endpoint: str, topic: str, groups: int, per_group: int) -> dict[str, Any]:
    """FIFO messages of message groups g0..g{groups-1}, interleaved (g0-0, g1-0, ..., g0-1, ...),
    sent one at a time: each group's send order is its `seq` order."""
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        sent = []
        for n in range(per_group):
            for g in range(groups):
                m = Message()
                m.topic = topic
                m.body = f"g{g}-{n}".encode()
                m.message_group = f"g{g}"
                m.add_property("seq", str(n))
                sent.append({"group": f"g{g}", "seq": n, "id": producer.send(m).message_id})
        return {"sent": sent}
    finally:
        producer.shutdown()


def fifo_receive(
    endpoint: str,
    topic: str,
    group: str,
    expected: int,
    ack_first: int,
    hold: int,
    invisible_s: int,
    await_s: int = 2,
) -> dict[str, Any]:
    """A SimpleConsumer that acknowledges the first `ack_first` messages it receives, then keeps
    the next `hold` (at least one) unacknowledged and stops (`expected` 0: until it holds them);
    with `hold` 0 it acknowledges everything until `expected` messages were acknowledged. Every
    receive and acknowledgement, in the order they happened. Each receive waits at most `await_s`
    for a message (its long poll)."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=await_s)
    consumer.startup()
    try:
        events: list[dict[str, Any]] = []
        acked = held = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if hold and held >= hold or not hold and acked >= expected:
                break
            for m in consumer.receive(32, invisible_s):
                seen = {"group": m.message_group, "body": m.body.decode(), "attempt": m.delivery_attempt}
                events.append({"event": "receive", **seen})
                if hold and acked >= ack_first:
                    held += 1
                    continue
                consumer.ack(m)
                acked += 1
                events.append({"event": "ack", **seen})
        return {"events": events}
    finally:
        consumer.shutdown()


def change_invisible(endpoint: str, topic: str, group: str, first_s: int, longer_s: int) -> dict[str, Any]:
    """Receive two messages (of a one-queue topic: one receive can take both) with a `first_s`
    invisible duration and at once make each invisible for `longer_s`
    (change_invisible_duration). The second is acknowledged, first with its old
    receipt handle (through the client's generated stub), then with the one the change gave.
    The first is left alone: every delivery until it comes back (at most a minute)."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        got: list[Any] = []
        changed_at: list[float] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            for m in consumer.receive(2, first_s):
                old = m.receipt_handle
                consumer.change_invisible_duration(m, longer_s)
                changed_at.append(time.monotonic())
                got.append((m, old))
        (first, _), (second, second_old) = got
        ack = AckMessageRequest()
        ack.group.name = group
        ack.topic.name = topic
        entry = ack.entries.add()
        entry.message_id = second.message_id
        entry.receipt_handle = second_old
        with grpc.insecure_channel(endpoint) as channel:
            reply = MessagingServiceStub(channel).AckMessage(ack, timeout=10)
            old_ack = Code.Name(reply.entries[0].status.code)
        consumer.ack(second)  # the handle the change gave: raises if refused
        later = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(d["id"] == first.message_id for d in later):
            for m in consumer.receive(1, 30):
                later.append({**described(m), "at": time.monotonic()})
                consumer.ack(m)
        return {
            "first": described(first),
            "second": described(second),
            "changed_at": changed_at,
            "handle_changed": second.receipt_handle != second_old,
            "old_handle_ack": old_ack,
            "later": later,
        }
    finally:
        consumer.shutdown()


def tls(endpoint: str, topic: str, group: str, count: int) -> dict[str, Any]:
    """Send `count` messages over TLS and receive them back over TLS: the bodies, or the error."""
    cfg = ClientConfiguration(endpoint, Credentials("ak", "sk"), request_timeout=5)
    try:
        producer = Producer(cfg, (topic,), tls_enable=True)
        producer.startup()
        try:
            sent = [producer.send(message(topic, i)).message_id for i in range(count)]
        finally:
            producer.shutdown()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=2, tls_enable=True)
    consumer.startup()
    try:
        bodies: list[str] = []
        deadline = time.monotonic() + 60
        while len(bodies) < count and time.monotonic() < deadline:
            for m in consumer.receive(32, 15):
                consumer.ack(m)
                bodies.append(m.body.decode())
        return {"sent": sent, "bodies": bodies}
    finally:
        consumer.shutdown()


def wake(endpoint: str, topic: str, group: str, count: int, pause_s: float = 0.5) -> dict[str, Any]:
    """A SimpleConsumer waiting in a receive (long poll 20 s) on one thread; `count` messages sent
    one at a time from another, each once the one before it was received and `pause_s` after the
    consumer went back into its receive, so that each arrives while the consumer waits. Per
    message: its id, and the seconds from its send to its receipt."""
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression("*")}, await_duration=20)
    consumer.startup()
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    got: dict[str, float] = {}
    in_call: dict[str, int] = {}  # message id -> the receive call that took it
    calls = [0]  # receive calls the consumer went into
    arrived = threading.Condition()
    done = threading.Event()

    errors: list[str] = []

    def receiver() -> None:
        while not done.is_set():
            with arrived:
                calls[0] += 1
                arrived.notify_all()
            try:
                batch = consumer.receive(32, 30)
            except Exception as exc:  # a receive that failed (a deadline on a busy machine): again
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            for m in batch:
                with arrived:
                    got[m.message_id] = time.monotonic()
                    in_call[m.message_id] = calls[0]
                    arrived.notify_all()
                consumer.ack(m)

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    try:
        out = []
        last_call = 0  # the receive call that took the message before
        for i in range(count):
            with arrived:  # the consumer went into its next receive
                arrived.wait_for(lambda last_call=last_call: calls[0] > last_call, timeout=25)
            time.sleep(pause_s)  # its request on its way: the receive is waiting at the endpoint
            at = time.monotonic()
            sent = producer.send(message(topic, i)).message_id
            with arrived:  # far beyond the 20 s long poll: a message not woken for is late
                arrived.wait_for(lambda sent=sent: sent in got, timeout=25)
                last_call = in_call.get(sent, calls[0])
            out.append({"id": sent, "after": got.get(sent, at + 99) - at})
        return {"messages": out, "receive_errors": errors}
    finally:
        done.set()
        producer.shutdown()
        consumer.shutdown()


def main() -> None:
    endpoint, command, *args = sys.argv[1:]
    if command == "send":
        out = send(endpoint, args[0], int(args[1]), int(args[2]))
    elif command == "receive":
        out = receive(endpoint, args[0], args[1], int(args[2]), args[3], *(int(a) for a in args[4:6]))
    elif command == "redeliver":
        out = redeliver(endpoint, args[0], args[1], *(int(a) for a in args[2:3]))
    elif command == "signed":
        out = signed(endpoint, *args)
    elif command == "unsigned":
        out = unsigned(endpoint, *args)
    elif command == "forward":
        out = forward(
            endpoint, args[0], args[1], *(int(a) for a in args[2:3]), *(float(a) for a in args[3:4])
        )
    elif command == "push":
        out = push(endpoint, args[0], args[1], int(args[2]), int(args[3]), *(float(a) for a in args[4:6]))
    elif command == "ack-all":
        out = ack_all(endpoint, args[0], args[1], int(args[2]))
    elif command == "hold":
        out = hold(endpoint, args[0], args[1], float(args[2]), args[3])
    elif command == "produce-consume":
        out = produce_consume(endpoint, args[0], args[1], float(args[2]), *args[3:6])
    elif command == "fifo-send":
        out = fifo_send(endpoint, args[0], int(args[1]), int(args[2]))
    elif command == "fifo-receive":
        out = fifo_receive(endpoint, args[0], args[1], *(int(a) for a in args[2:7]))
    elif command == "change-invisible":
        out = change_invisible(endpoint, args[0], args[1], int(args[2]), int(args[3]))
    elif command == "tls":
        out = tls(endpoint, args[0], args[1], int(args[2]))
    elif command == "wake":
        out = wake(endpoint, args[0], args[1], int(args[2]), *(float(a) for a in args[3:4]))
    else:
        out = raw(endpoint, *args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
