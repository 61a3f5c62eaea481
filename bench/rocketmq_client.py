"""The official RocketMQ Python client's half of bench/rocketmq.py, run in a process of its own
(its generated protobuf modules and tidelog's register the same names): it imports nothing of
tidelog. Prints one JSON document of figures.

    python -P bench/rocketmq_client.py ENDPOINT TOPIC GROUP MESSAGES IN_FLIGHT LATENCY_TOPIC

(`-P`: bench/ holds rocketmq.py, which must not hide the official client's package.)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

BODY = b"x" * 1024


def _message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = BODY
    m.keys = f"k{i}"
    return m


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials("ak", "sk"), request_timeout=30)


def send(endpoint: str, topic: str, messages: int, in_flight: int) -> dict[str, float]:
    """Messages/s of `send` one at a time, then of `send_async` with `in_flight` outstanding."""
    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    try:
        producer.send(_message(topic, -1))  # route and connection set up before the clock starts
        t0 = time.perf_counter()
        for i in range(messages):
            producer.send(_message(topic, i))
        sync_s = time.perf_counter() - t0
        window = threading.Semaphore(in_flight)
        t0 = time.perf_counter()
        futures = []
        for i in range(messages):
            window.acquire()
            f = producer.send_async(_message(topic, i))
            f.add_done_callback(lambda _f: window.release())
            futures.append(f)
        for f in futures:
            f.result(timeout=60)
        async_s = time.perf_counter() - t0
    finally:
        producer.shutdown()
    return {"sync": messages / sync_s, "async": messages / async_s}


def receive(endpoint: str, topic: str, group: str, messages: int) -> float:
    """Messages/s of a SimpleConsumer receiving 32 at a time and acknowledging each message (from
    a pool of threads: the client's ack_async hands back no future)."""
    consumer = SimpleConsumer(_config(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    got = 0
    try:
        with ThreadPoolExecutor(16) as pool:
            t0 = time.perf_counter()
            while got < messages and time.perf_counter() - t0 < 600:
                batch = consumer.receive(32, 60)
                for m in batch:
                    pool.submit(consumer.ack, m)
                got += len(batch)
        return got / (time.perf_counter() - t0)
    finally:
        consumer.shutdown()


def latency(endpoint: str, topic: str, group: str, messages: int) -> list[float]:
    """Seconds from each send (one at a time) to its receipt by a SimpleConsumer already waiting in
    a receive (long poll 20 s, acknowledging from a pool of threads), `messages` of them."""
    consumer = SimpleConsumer(_config(endpoint), group, {topic: FilterExpression("*")}, await_duration=20)
    consumer.startup()
    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    seen: list[float] = []
    done = threading.Event()

    def receiver(pool: ThreadPoolExecutor) -> None:
        while not done.is_set():
            for m in consumer.receive(32, 60):
                seen.append(time.time() - float(m.properties["sent"]))
                pool.submit(consumer.ack, m)
            if len(seen) >= messages:
                done.set()

    try:
        with ThreadPoolExecutor(16) as pool:
            thread = threading.Thread(target=receiver, args=(pool,), daemon=True)
            thread.start()
            time.sleep(1.0)  # the consumer's first receive is waiting
            for i in range(messages):
                m = _message(topic, i)
                m.add_property("sent", repr(time.time()))
                producer.send(m)
            done.wait(60)
            done.set()
        return seen
    finally:
        producer.shutdown()
        consumer.shutdown()


def main() -> None:
    endpoint, topic, group, messages, in_flight, latency_topic = sys.argv[1:7]
    n = int(messages)
    out: dict[str, Any] = send(endpoint, topic, n, int(in_flight))
    out["receive_ack"] = receive(endpoint, topic, group, 2 * n + 1)
    figures: dict[str, Any] = {k: round(v) for k, v in out.items()}
    figures["latency_s"] = latency(endpoint, latency_topic, group, n)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
