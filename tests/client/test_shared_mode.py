"""Scenario: the shared subscription mode on a real local cluster (client/sharedconsumer.py,
broker/shared.py).

- four members, one of which never acknowledges: its messages go to the others after their
  invisible duration, and every message is acknowledged exactly once;
- a message that fails `max_delivery_attempts` times lands in the group's dead-letter topic once;
- stale and forged receipts, and acknowledgements of messages that were never received, are refused
  with typed errors and change nothing;
- the master killed with SIGKILL during consumption: nothing is lost, and no acknowledged message
  is delivered again.
"""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster, tide
from tidelog import localcluster
from tidelog.client import Client, OutMessage
from tidelog.client import modes as md
from tidelog.errors import (
    InvalidArgumentError,
    ReceiptInvalidError,
    SubscriptionConflictError,
    TidelogError,
    TopicNotFoundError,
)

pytestmark = pytest.mark.slow

Pos = tuple[str, int, int]  # (broker set, queue, offset)


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=30.0) as c:
        yield c


def fill(client: Client, topic: str, n: int, queues: int = 6) -> set[Pos]:
    client.admin().create_topic(topic, queues=queues)
    receipts = client.producer().send_batch(topic, [OutMessage(f"m{i}".encode()) for i in range(n)])
    return {(r.broker_set, r.queue, r.queue_offset) for r in receipts}


class SharedMember(threading.Thread):
    """A shared-mode member polling in its own thread with its own client; `decide(message)` says
    what it does with each message: "ack", "nack" or "keep" (never acknowledge)."""

    def __init__(self, controllers: str, group: str, topic: str, decide: Callable[[Any], str], **opts: Any):
        super().__init__(daemon=True)
        self.client = Client(controllers)
        opts = {"mode": "shared", "heartbeat_interval": 0.3, **opts}
        self.consumer = self.client.consumer(group=group, topic=topic, **opts)
        self.decide = decide
        self.delivered: list[tuple[Pos, int]] = []  # (where, delivery count)
        self.acked: list[tuple[Pos, int]] = []
        self.failed_acks = 0
        self.unsure: list[Pos] = []  # acks that failed: stored or not, the client cannot know
        self.error: BaseException | None = None
        self._quit = threading.Event()

    def run(self) -> None:
        try:
            while not self._quit.is_set():
                for m in self.consumer.poll(max_messages=20, timeout=0.3):
                    pos = (m.broker_set, m.queue, m.offset)
                    self.delivered.append((pos, m.delivery_count))
                    what = self.decide(m)
                    try:
                        if what == "ack":
                            self.consumer.ack(m)
                            self.acked.append((pos, m.delivery_count))
                        elif what == "nack":
                            self.consumer.nack(m)
                    except TidelogError:
                        self.failed_acks += 1  # the message comes back after its time
                        self.unsure.append(pos)  # ... unless the ack was stored and its answer lost
        except BaseException as exc:  # reported by leave()
            self.error = exc

    def leave(self) -> None:
        self._quit.set()
        self.join(timeout=30)
        try:
            self.consumer.close()
        finally:
            self.client.close()
        assert self.error is None, f"member failed: {self.error!r}"


def wait_for(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.05)


def acked(members: list[SharedMember]) -> collections.Counter[Pos]:
    return collections.Counter(p for m in members for p, _ in list(m.acked))


def test_what_one_member_never_acknowledges_goes_to_the_others(cluster: LocalCluster, client: Client) -> None:
    sent = fill(client, "sh", 600)
    workers = [
        SharedMember(cluster.controllers, "sh", "sh", lambda m: "ack", invisible_duration=2.0)
        for _ in range(3)
    ]
    # The member that never acknowledges polls without a pause, so it takes most of what becomes
    # visible again, round after round, until the others have had it all: its invisible duration
    # is one such round, and is short so that the rounds are.
    sloth = SharedMember(cluster.controllers, "sh", "sh", lambda m: "keep", invisible_duration=0.5)
    members = [*workers, sloth]
    for m in members:
        m.start()
    try:
        wait_for("every message acknowledged", lambda: set(acked(workers)) >= sent, 60)
    finally:
        for m in members:
            m.leave()
    done = acked(workers)
    assert set(done) == sent and max(done.values()) == 1, "each message acknowledged exactly once"
    # describe's view: the group's floor stands at the end of every queue, nothing left to read
    rows = client.admin().group_lag("sh", "sh")
    assert all(r["lag"] == 0 for r in rows), rows
    assert all(r["committed"] == r["confirmed"] for r in rows if r["confirmed"] > r["min"]), rows
    kept = {p for p, _ in sloth.delivered}
    assert kept, "the member that never acknowledges received some"
    again = {p: n for m in workers for p, n in m.acked if p in kept}
    assert again.keys() == kept and all(n >= 2 for n in again.values()), "they came back, counted"
    assert sum(1 for m in workers if m.acked) >= 2, "the load was shared"


def test_a_message_failing_max_attempts_lands_in_the_dead_letter_topic_once(
    cluster: LocalCluster, client: Client
) -> None:
    client.admin().create_topic("poisoned", queues=2)
    p = client.producer()
    good = [p.send("poisoned", f"ok{i}".encode()) for i in range(10)]
    bad = p.send("poisoned", b"poison", key="p")
    member = SharedMember(
        cluster.controllers,
        "dl",
        "poisoned",
        lambda m: "nack" if m.body == b"poison" else "ack",
        max_delivery_attempts=3,
    )
    member.start()
    dlq = md.dlq_topic("dl")
    try:
        wait_for("the good messages", lambda: len(acked([member])) >= len(good), 30)

        def dead_letters() -> list[Any]:
            with Client(cluster.controllers) as c:
                try:
                    return c.reader(dlq, 0, broker_set=bad.broker_set).read(max_messages=10, timeout=0.5)
                except TopicNotFoundError:
                    return []  # the broker learns of the new topic from its next heartbeat

        wait_for("the dead letter", lambda: bool(dead_letters()), 30)
        time.sleep(1.5)  # more receives: the poison must not be copied again
        letters = dead_letters()
    finally:
        member.leave()
    assert len(letters) == 1
    (letter,) = letters
    assert letter.body == b"poison" and letter.key == "p"
    props = letter.properties
    assert props[md.ORIGIN_TOPIC] == "poisoned" and int(props[md.ORIGIN_QUEUE]) == bad.queue
    assert int(props[md.ORIGIN_OFFSET]) == bad.queue_offset and props[md.DELIVERY_ATTEMPTS] == "3"
    assert props[md.ORIGIN_MESSAGE_ID] == bad.message_id
    counts = [n for pos, n in member.delivered if pos == (bad.broker_set, bad.queue, bad.queue_offset)]
    assert counts == [1, 2, 3], "delivered max_delivery_attempts times, then moved"


def test_stale_forged_and_foreign_receipts_are_refused(cluster: LocalCluster, client: Client) -> None:
    client.admin().create_topic("receipts", queues=1)
    client.producer().send("receipts", b"one")
    with client.consumer(group="rc", topic="receipts", mode="shared", invisible_duration=0.5) as c:
        (m,) = c.poll(max_messages=1, timeout=5)
        stale = m.receipt
        time.sleep(0.7)
        (again,) = c.poll(max_messages=1, timeout=5)
        assert again.offset == m.offset and again.delivery_count == 2
        with pytest.raises(ReceiptInvalidError):
            c.ack(m)  # its invisible time ran out: it went out again
        m.receipt = "zz.1.1"
        with pytest.raises(InvalidArgumentError):
            c.ack(m)
        m.receipt = f"{m.offset:x}.1.ffff"
        with pytest.raises(ReceiptInvalidError):
            c.ack(m)  # never given
        (read,) = client.reader("receipts", 0).read(max_messages=1, timeout=5)
        with pytest.raises(InvalidArgumentError):
            c.ack(read)  # not a received message
        assert again.receipt != stale
        c.ack(again)  # nothing above changed the state: the current receipt still works
        with pytest.raises(ReceiptInvalidError):
            c.ack(again)  # finished
        assert c.poll(max_messages=1, timeout=0.5) == []
        with pytest.raises(InvalidArgumentError):
            c.change_invisible_duration(again, -1)
    # a member of another mode is refused while the shared member lives
    with client.consumer(group="rc2", topic="receipts", mode="shared") as first:
        first.poll(max_messages=1, timeout=0)
        with (
            client.consumer(group="rc2", topic="receipts") as other,
            pytest.raises(SubscriptionConflictError),
        ):
            other.poll(max_messages=1, timeout=0)


# The invisible duration of the members consuming while their master is killed: well above the
# time a worker takes to acknowledge what it received.
KILL_INVISIBLE_S = 2.0


def test_master_killed_during_shared_consumption(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    # deploy/local.yaml with a failover in about half its time: the controller fails the killed
    # master over after 1.5 s of silence instead of 2.5 s (brokers beat every 0.3 s)
    topology = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    topology["controller"].update(heartbeat_interval_ms=300, heartbeat_timeout_ms=1500)
    topology["broker"]["heartbeat_interval_ms"] = 300
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology))
    c = cluster_factory(topology=path, name="sharedkill")
    with Client(c.controllers, send_timeout=30.0) as client:
        sent = fill(client, "shk", 3000, queues=4)
        workers = [
            SharedMember(c.controllers, "shk", "shk", lambda m: "ack", invisible_duration=KILL_INVISIBLE_S)
            for _ in range(2)
        ]
        for m in workers:
            m.start()
        try:
            wait_for("a quarter acknowledged", lambda: len(acked(workers)) >= len(sent) // 4, 60)
            master = _master_name(c)
            localcluster.kill(c.data_dir, master, signal.SIGKILL)

            def settled() -> bool:
                return set(acked(workers)) | {p for m in workers for p in m.unsure} >= sent

            wait_for("every message acknowledged", settled, 90)
            # an ack that failed and was not stored: its message comes back within this quiet
            # period, and is acknowledged by a worker, and nothing acknowledged comes back
            time.sleep(KILL_INVISIBLE_S + 1.0)
        finally:
            for m in workers:
                m.leave()
        # nothing is left: a new member of the group finds no message to receive
        with client.consumer(group="shk", topic="shk", mode="shared") as last:
            left = last.poll(max_messages=100, timeout=3.0)
        assert [(m.broker_set, m.queue, m.offset) for m in left] == [], "messages left unacknowledged"
    done = acked(workers)
    unsure = {p for m in workers for p in m.unsure} - set(done)
    assert set(done) | unsure == sent, "messages lost"
    assert len(unsure) <= sum(m.failed_acks for m in workers)
    assert max(done.values()) == 1, "a message acknowledged twice"
    last_ack = {p: n for m in workers for p, n in m.acked}
    later = [(p, n) for m in workers for p, n in m.delivered if p in last_ack and n > last_ack[p]]
    assert later == [], "an acknowledged message was delivered again"


def _master_name(c: LocalCluster) -> str:
    rows = json.loads(tide("broker", "list", "--controllers", c.controllers, "--json").stdout)
    address = next(r["address"] for r in rows if r["role"] == "master")
    return next(p["name"] for p in c.state()["processes"] if p.get("address") == address)


def test_key_shared_keeps_each_keys_order_across_a_join_and_a_leave(
    cluster: LocalCluster, client: Client
) -> None:
    client.admin().create_topic("ks", queues=4)
    n_keys, per_key = 12, 40
    batch = [OutMessage(f"{k}:{i}".encode(), f"k{k}") for i in range(per_key) for k in range(n_keys)]
    client.producer().send_batch("ks", batch)
    events: list[tuple[str, int, int]] = []  # (key, index, delivery count) in the order delivered
    lock = threading.Lock()

    def work(m: Any) -> str:
        k, i = m.body.decode().split(":")
        with lock:  # recorded before the acknowledgement that lets the key's next message out
            events.append((k, int(i), m.delivery_count))
        time.sleep(0.002)
        return "ack"

    def member() -> SharedMember:
        return SharedMember(cluster.controllers, "ksg", "ks", work, mode="key_shared")

    first, second = member(), member()
    first.start()
    second.start()
    late: SharedMember | None = None
    try:
        wait_for("a third of the messages", lambda: len(acked([first, second])) >= len(batch) // 3, 60)
        late = member()
        late.start()
        wait_for("the newcomer to work", lambda: len(late.acked) >= 20, 30)
        first.leave()
        wait_for("every message", lambda: len(acked([first, second, late])) >= len(batch), 60)
    finally:
        for m in (first, second, late):
            if m is not None and m.is_alive():
                m.leave()
    members = [first, second, late]
    done = acked(members)
    assert len(done) == len(batch) and max(done.values()) == 1
    for k in range(n_keys):
        # each message of the key as first worked on: a lease given to a receive its member had
        # stopped waiting for (a poll's timeout) comes back with delivery count 2, and must still
        # come before the key's next message
        order = list(dict.fromkeys(i for key, i, _ in events if key == str(k)))
        assert order == list(range(per_key)), f"key {k} out of order: {order}"
    assert all(m.acked for m in members), "every member took part"
