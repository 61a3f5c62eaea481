"""Scenario: members of one consumer group hand queues over exactly, on a real local cluster.

Members start together, join and leave while the group reads 6,000 keyed messages: every message
is delivered once in total. A member killed with SIGKILL (its own process) loses nothing, and only
what it delivered after its last commit is delivered again.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import REPO, LocalCluster
from tidelog.client import Client, OutMessage

pytestmark = pytest.mark.slow

Pos = tuple[str, int, int]  # (broker set, queue, offset)
MEMBER_SCRIPT = Path(__file__).with_name("handover_member.py")
N_MESSAGES = 6000
POLL_12 = 120  # a poll of the members of a 12-queue topic


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=20.0) as c:
        yield c


def fill(client: Client, topic: str) -> set[Pos]:
    client.admin().create_topic(topic, queues=6)
    batch = [OutMessage(f"m{i}".encode(), f"k{i % 97}") for i in range(N_MESSAGES)]
    sent = {(r.broker_set, r.queue, r.queue_offset) for r in client.producer().send_batch(topic, batch)}
    assert len(sent) == N_MESSAGES and len({q for _, q, _ in sent}) == 6
    return sent


class Member(threading.Thread):
    """One group member polling in its own thread, with its own client, until told to leave;
    `poll_size` messages a poll at most (spread over the member's queues)."""

    def __init__(self, controllers: str, group: str, topic: str, poll_size: int = 20, **opts: Any) -> None:
        super().__init__(daemon=True)
        self.poll_size = poll_size
        self.client = Client(controllers)
        self.events: list[tuple[str, list[tuple[str, int]]]] = []
        self.consumer = self.client.consumer(
            group=group,
            topic=topic,
            heartbeat_interval=0.3,
            on_assigned=lambda qs: self.events.append(("assigned", qs)),
            on_revoked=lambda qs: self.events.append(("revoked", qs)),
            **opts,
        )
        self.seen: list[Pos] = []
        self.error: BaseException | None = None
        self._quit = threading.Event()

    def run(self) -> None:
        try:
            while not self._quit.is_set():
                for m in self.consumer.poll(max_messages=self.poll_size, timeout=0.2):
                    self.seen.append((m.broker_set, m.queue, m.offset))
                time.sleep(0.01)  # the application's work: a rebalance happens mid-way through
        except BaseException as exc:  # reported by leave()
            self.error = exc

    def leave(self) -> None:
        self._quit.set()
        self.join(timeout=20)
        try:
            self.consumer.close()
        finally:
            self.client.close()
        assert self.error is None, f"member failed: {self.error!r}"


def wait_for(what: str, done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.05)


def tally(members: list[Member], extra: Iterable[Pos] = ()) -> collections.Counter[Pos]:
    return collections.Counter([p for m in members for p in list(m.seen)] + list(extra))


def test_members_started_together_deliver_every_message_once(cluster: LocalCluster, client: Client) -> None:
    sent = fill(client, "together")
    members = [Member(cluster.controllers, "together", "together") for _ in range(3)]
    try:
        for m in members:
            m.start()
        wait_for("every message", lambda: set(tally(members)) >= sent, 35)
        ids = {m.consumer.member_id for m in members}

        def owners() -> set[str | None]:
            return {r["owner"] for r in client.admin().group_lag("together", "together")}

        wait_for("`tide group describe` to show the three owners", lambda: owners() == ids, 10)
    finally:
        for m in members:
            m.leave()
    assert owners() == {None}, "close() released every queue"
    seen = tally(members)
    assert set(seen) == sent
    assert {p: n for p, n in seen.items() if n > 1} == {}, "duplicates at the start of the group"
    # the load was shared, and every member heard of the queues it got
    assert all(m.seen and any(kind == "assigned" for kind, _ in m.events) for m in members)


def test_a_member_joining_then_leaving_duplicates_nothing(cluster: LocalCluster, client: Client) -> None:
    sent = fill(client, "joinleave")
    members = [Member(cluster.controllers, "joinleave", "joinleave") for _ in range(3)]
    for m in members:
        m.start()
    late: Member | None = None
    try:
        wait_for("a quarter of the messages", lambda: len(tally(members)) >= N_MESSAGES // 4, 30)
        late = Member(cluster.controllers, "joinleave", "joinleave")
        late.start()
        wait_for("the fourth member to read", lambda: len(late.seen) >= 100, 20)
        late.leave()
        wait_for("every message", lambda: set(tally([*members, late])) >= sent, 30)
    finally:
        for m in members:
            m.leave()
        if late is not None and late.is_alive():
            late.leave()
    seen = tally([*members, late])
    assert set(seen) == sent, "messages lost"
    assert {p: n for p, n in seen.items() if n > 1} == {}, "duplicates at a join or a leave"
    # the members that gave the newcomer queues were told before they handed them over
    assert any(kind == "revoked" for m in members for kind, _ in m.events)


def read_member_output(path: Path) -> tuple[list[Pos], dict[tuple[str, int], int]]:
    """What the killed member printed: its deliveries, and per queue the highest offset it committed."""
    delivered: list[Pos] = []
    committed: dict[tuple[str, int], int] = {}
    for line in path.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "D" and len(rest.split()) == 3:
            bs, q, off = rest.split()
            delivered.append((bs, int(q), int(off)))
        elif kind == "C":
            try:
                doc = json.loads(rest)
            except ValueError:
                continue  # the last line, cut by the kill
            for bs, q, off in doc:
                committed[(bs, q)] = max(off, committed.get((bs, q), -1))
    return delivered, committed


def test_a_killed_member_redelivers_only_what_it_had_not_committed(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    sent = fill(client, "killed")
    out = tmp_path / "member.out"
    opts = {"session_timeout": 3.0}
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), cluster.controllers, "killed", "killed", "3.0"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    members = [Member(cluster.controllers, "killed", "killed", **opts) for _ in range(2)]
    try:
        for m in members:
            m.start()

        def victim_read_and_committed() -> bool:
            delivered, committed = read_member_output(out)
            return len(delivered) >= 300 and bool(committed)

        wait_for("the member process to read and commit", victim_read_and_committed, 30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        delivered, committed = read_member_output(out)
        wait_for("the others to read everything", lambda: set(tally(members, delivered)) >= sent, 30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for m in members:
            m.leave()
    survivors = tally(members)
    assert {p: n for p, n in survivors.items() if n > 1} == {}, "duplicates among the live members"
    assert set(survivors) | set(delivered) == sent, "messages lost"
    again = [p for p in delivered if p in survivors]
    # only what the killed member delivered at or past its last commit of that queue comes again
    assert all(off >= committed.get((bs, q), -1) for bs, q, off in again), "re-delivered committed messages"
    assert len(again) <= sum(1 for bs, q, off in delivered if off >= committed.get((bs, q), -1))


def test_three_then_five_then_two_members_while_50000_keyed_messages_are_produced(
    cluster: LocalCluster, client: Client
) -> None:
    """The issue's scenario: 3 members, then 5, then 2, on a 12-queue topic while 50,000 keyed
    messages are produced: each delivered exactly once in total, and within each member's
    tenure of a queue every key's messages come in the order they were sent."""
    topic, total, keys = "churn12", 50_000, 200
    client.admin().create_topic(topic, queues=12)
    produced: list[Pos] = []
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with Client(cluster.controllers, send_timeout=30.0) as c:
                p = c.producer()
                for start in range(0, total, 500):
                    batch = [
                        OutMessage(f"{i % keys}:{i}".encode(), f"k{i % keys}")
                        for i in range(start, start + 500)
                    ]
                    produced.extend(
                        (r.broker_set, r.queue, r.queue_offset) for r in p.send_batch(topic, batch)
                    )
                    time.sleep(0.02)  # spread the production over the membership changes
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=produce, daemon=True)
    # 120 a poll (10 a queue for one member of all 12; 20 polls took 3 a queue): the two members
    # left at the end drain 40,000 messages in hundreds of polls rather than thousands
    members = [Member(cluster.controllers, "churn", topic, POLL_12) for _ in range(3)]
    writer.start()
    for m in members:
        m.start()
    extra: list[Member] = []
    try:
        wait_for("a fifth of the messages", lambda: len(tally(members)) >= total // 5, 60)
        extra = [Member(cluster.controllers, "churn", topic, POLL_12) for _ in range(2)]
        for m in extra:
            m.start()
        wait_for("the newcomers to read", lambda: all(len(m.seen) >= 50 for m in extra), 60)
        for m in members:
            m.leave()  # three leave: two remain
        writer.join(timeout=120)
        assert not failures and len(produced) == total, failures
        wait_for("every message", lambda: set(tally([*members, *extra])) >= set(produced), 120)
    finally:
        for m in [*members, *extra]:
            if m.is_alive():
                m.leave()
    everyone = [*members, *extra]
    seen = tally(everyone)
    assert set(seen) == set(produced), "messages lost"
    assert {p: n for p, n in seen.items() if n > 1} == {}, "duplicates through 3 -> 5 -> 2 members"
    # within each member's reads of a queue, offsets only go up (the queue's order, which is the
    # send order of each key: one key lives on one queue)
    for m in everyone:
        last: dict[tuple[str, int], int] = {}
        for bs, q, off in m.seen:
            assert off > last.get((bs, q), -1), f"{m.consumer.member_id} read {bs}/{q} out of order"
            last[(bs, q)] = off
