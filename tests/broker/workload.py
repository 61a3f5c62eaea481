"""A producer that follows the master of a broker set and records what was acknowledged.

It sends one message at a time with an explicit queue (sequence number modulo the queue count),
retries the same body on another master until it is acknowledged or a deadline passes, and
records per body: the ack (queue, time) or that an attempt ended with an unknown outcome (the
message may have been stored, so a copy of it may legitimately show up twice in the log).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.brokers import BrokerSetProcs
from tidelog.errors import InSyncReplicasNotEnoughError, InvalidArgumentError, TopicNotFoundError

# Refused before anything was appended: the body was certainly not stored by that attempt.
NOT_WRITTEN = (InSyncReplicasNotEnoughError, TopicNotFoundError, InvalidArgumentError)


def body_of(seq: int) -> bytes:
    return b"m-%08d" % seq


def seq_of(body: bytes) -> int:
    return int(body[2:])


@dataclass
class Ack:
    body: bytes
    queue: int
    at: float  # time.monotonic() when the ack arrived


@dataclass
class FollowingProducer:
    bs: BrokerSetProcs
    topic: str
    queues: int
    body_deadline_s: float = 20.0
    rpc_timeout_s: float = 2.0
    acked: list[Ack] = field(default_factory=list)
    uncertain: set[bytes] = field(default_factory=set)  # some attempt had an unknown outcome
    given_up: list[bytes] = field(default_factory=list)  # never acknowledged before the deadline
    errors: Counter[str] = field(default_factory=Counter)
    crashed: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._master: int | None = None

    def start(self) -> FollowingProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.body_deadline_s + 10)
        assert not self._thread.is_alive(), "the producer thread did not stop"
        assert self.crashed is None, f"the producer thread crashed: {self.crashed!r}"

    def acks_since(self, t: float) -> int:
        return sum(1 for a in self.acked if a.at >= t)

    def wait_acks_since(self, t: float, count: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.acks_since(t) < count:
            assert time.monotonic() < end, f"fewer than {count} acks within {timeout}s (errors {self.errors})"
            assert self._thread.is_alive(), f"the producer thread ended: {self.crashed!r}"
            time.sleep(0.05)

    def max_gap(self) -> float:
        times = [a.at for a in self.acked]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def _run(self) -> None:
        try:
            seq = 0
            while not self._stop.is_set():
                self._send(body_of(seq), seq % self.queues)
                seq += 1
        except BaseException as exc:  # reported by stop()
            self.crashed = exc

    def _send(self, body: bytes, queue: int) -> None:
        deadline = time.monotonic() + self.body_deadline_s
        while time.monotonic() < deadline:
            i = self._master if self._master is not None else self.bs.master_index()
            if i is None:
                time.sleep(0.05)
                continue
            self._master = i
            try:
                self.bs.clients[i].produce(self.topic, [body], queue=queue, timeout=self.rpc_timeout_s)
            except NOT_WRITTEN as exc:
                self.errors[type(exc).__name__] += 1
                time.sleep(0.05)
            except (
                Exception
            ) as exc:  # NOT_MASTER, FLUSH_SLAVE_TIMEOUT, UNAVAILABLE, deadline: unknown outcome
                self.errors[type(exc).__name__] += 1
                self.uncertain.add(body)
                self._master = None
                time.sleep(0.05)
            else:
                self.acked.append(Ack(body, queue, time.monotonic()))
                return
        self.given_up.append(body)


def check_log(per_queue: dict[int, list[bytes]], producer: FollowingProducer, where: str) -> None:
    """Every acked body is in its queue, in send order; only uncertain bodies may repeat."""
    sent = {a.body for a in producer.acked} | producer.uncertain | set(producer.given_up)
    for q, bodies in per_queue.items():
        counts = Counter(bodies)
        assert set(bodies) <= sent, (
            f"{where} queue {q} holds bodies never sent: {sorted(set(bodies) - sent)[:5]}"
        )
        dups = {b for b, n in counts.items() if n > 1}
        assert dups <= producer.uncertain, (
            f"{where} queue {q} repeats bodies whose first attempt did not fail: {sorted(dups - producer.uncertain)}"
        )
        first: list[bytes] = []
        seen: set[bytes] = set()
        for b in bodies:
            if b not in seen:
                seen.add(b)
                first.append(b)
        assert [seq_of(b) for b in first] == sorted(seq_of(b) for b in first), (
            f"{where} queue {q} is out of order"
        )
        acked_q = [a.body for a in producer.acked if a.queue == q]
        missing = [b for b in acked_q if b not in seen]
        assert not missing, f"{where} queue {q} lost {len(missing)} acked bodies, e.g. {missing[:5]}"
