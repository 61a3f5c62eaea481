"""Scenario: the subscription modes on a real local cluster (client/modes.py).

- failover: one active member reads every queue while a standby waits; a clean leave hands all
  queues over without a duplicate; a SIGKILL of the active member's process loses nothing and
  re-delivers only what it had not committed;
- exclusive: a second member is refused with SUBSCRIPTION_CONFLICT; after the first leaves, a new
  member reads the rest, each message once;
- a member of another mode is refused by a group already reading in one mode;
- broadcast: every member reads every message, with its own offsets (a member that comes back
  under its member id resumes where it stopped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.conftest import REPO, LocalCluster, tide
from tests.client.test_group_handover import (
    MEMBER_SCRIPT,
    N_MESSAGES,
    Member,
    fill,
    read_member_output,
    tally,
    wait_for,
)
from tidelog.client import Client, OutMessage
from tidelog.errors import SubscriptionConflictError

pytestmark = pytest.mark.slow

# The poll size of the members that read a whole topic, or the rest of it after a hand-over
# (Member's default is 20): a member the hand-over happens from keeps 20, so that it is still
# mid-way when it leaves or is killed.
READ_ALL = 120


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=20.0) as c:
        yield c


def assigned(m: Member) -> set[tuple[str, int]]:
    return {q for kind, qs in list(m.events) if kind == "assigned" for q in qs}


def refused(m: Member) -> None:
    """Wait for member `m` to stop on SUBSCRIPTION_CONFLICT, having read nothing."""
    m.join(timeout=20)
    assert not m.is_alive(), "the refused member still polls"
    assert isinstance(m.error, SubscriptionConflictError), repr(m.error)
    assert m.seen == []
    m.error = None  # reported here, not by leave()


def test_failover_one_active_member_then_a_clean_hand_over(cluster: LocalCluster, client: Client) -> None:
    sent = fill(client, "fo")
    active = Member(cluster.controllers, "fo", "fo", mode="failover")
    standby = Member(cluster.controllers, "fo", "fo", poll_size=READ_ALL, mode="failover")
    active.start()
    try:
        wait_for("the active member to read", lambda: len(active.seen) >= 500, 30)
        standby.start()
        time.sleep(2.0)  # several of the standby's rebalances while the active member reads
        assert standby.seen == [] and assigned(standby) == set(), (
            "a standby read while the active member lives"
        )
        assert len(assigned(active)) == 6, "the active member reads every queue"
        assert len(active.seen) < N_MESSAGES, (
            "the hand-over must happen mid-way for this test to mean something"
        )
        active.leave()
        wait_for("the standby to read the rest", lambda: set(tally([active, standby])) >= sent, 30)
    finally:
        for m in (active, standby):
            if m.is_alive():
                m.leave()
    seen = tally([active, standby])
    assert set(seen) == sent, "messages lost"
    assert {p: n for p, n in seen.items() if n > 1} == {}, "duplicates at the hand-over"
    assert len(assigned(standby)) == 6


def test_failover_after_the_active_member_is_killed(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    sent = fill(client, "fokill")
    out = tmp_path / "active.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), cluster.controllers, "fokill", "fokill", "3.0", "failover"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    standby = Member(
        cluster.controllers, "fokill", "fokill", poll_size=READ_ALL, mode="failover", session_timeout=3.0
    )
    try:

        def read_and_committed() -> bool:
            delivered, committed = read_member_output(out)
            return len(delivered) >= 300 and bool(committed)

        wait_for("the active member's process to read and commit", read_and_committed, 30)
        standby.start()
        time.sleep(1.0)
        assert standby.seen == [], "a standby read while the active member lives"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        delivered, committed = read_member_output(out)
        wait_for(
            "the standby to take over and read the rest", lambda: set(tally([standby], delivered)) >= sent, 40
        )
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        standby.leave()
    survivors = tally([standby])
    assert {p: n for p, n in survivors.items() if n > 1} == {}
    assert set(survivors) | set(delivered) == sent, "messages lost"
    again = [p for p in delivered if p in survivors]
    assert all(off >= committed.get((bs, q), -1) for bs, q, off in again), "re-delivered committed messages"


def test_exclusive_refuses_a_second_member(cluster: LocalCluster, client: Client) -> None:
    sent = fill(client, "ex")
    first = Member(cluster.controllers, "ex", "ex", mode="exclusive")
    first.start()
    later: Member | None = None
    try:
        wait_for("the first member to read", lambda: len(first.seen) >= 500, 30)
        second = Member(cluster.controllers, "ex", "ex", mode="exclusive")
        second.start()
        refused(second)
        second.leave()
        first.leave()
        # the key is free again: a new exclusive member reads what the first left
        later = Member(cluster.controllers, "ex", "ex", poll_size=READ_ALL, mode="exclusive")
        later.start()
        wait_for("the later member to read the rest", lambda: set(tally([first, later])) >= sent, 30)
    finally:
        for m in (first, later):
            if m is not None and m.is_alive():
                m.leave()
    seen = tally([first, later] if later else [first])
    assert set(seen) == sent
    assert {p: n for p, n in seen.items() if n > 1} == {}


def test_a_member_of_another_mode_is_refused(cluster: LocalCluster, client: Client) -> None:
    fill(client, "mixed")
    first = Member(cluster.controllers, "mixed", "mixed", mode="failover")
    first.start()
    try:
        wait_for("the failover member to read", lambda: len(first.seen) >= 100, 30)
        other = Member(cluster.controllers, "mixed", "mixed")  # clustering
        other.start()
        refused(other)
        other.leave()
        assert first.is_alive() and first.error is None
        described = json.loads(
            tide(
                "group",
                "describe",
                "mixed",
                "--topic",
                "mixed",
                "--json",
                "--controllers",
                cluster.controllers,
            ).stdout
        )
        assert [(m["member"], m["mode"]) for m in described["members"]] == [
            (first.consumer.member_id, "failover")
        ]
    finally:
        first.leave()


def test_broadcast_every_member_reads_everything_with_its_own_offsets(
    cluster: LocalCluster, client: Client
) -> None:
    sent = fill(client, "bc")
    members = [
        Member(cluster.controllers, "bc", "bc", poll_size=READ_ALL, mode="broadcast", member_id=f"bc{i}")
        for i in range(2)
    ]
    for m in members:
        m.start()
    try:
        for m in members:
            wait_for("every message at each member", lambda m=m: set(tally([m])) >= sent, 40)
    finally:
        for m in members:
            m.leave()
    for m in members:
        seen = tally([m])
        assert set(seen) == sent and max(seen.values()) == 1, "each member reads everything once"
    # bc0 comes back under its member id: it resumes after what it read (committed on leave)
    more = client.producer().send_batch("bc", [OutMessage(f"n{i}".encode()) for i in range(60)])
    back = Member(cluster.controllers, "bc", "bc", mode="broadcast", member_id="bc0")
    back.start()
    try:
        new = {(r.broker_set, r.queue, r.queue_offset) for r in more}
        wait_for("the new messages", lambda: set(tally([back])) >= new, 30)
        time.sleep(1.0)
    finally:
        back.leave()
    assert set(tally([back])) == new, "a broadcast member that came back read old messages again"
