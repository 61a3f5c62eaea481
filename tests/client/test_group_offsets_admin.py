"""Scenario: an operator resets and deletes a consumer group's offsets with `tide group`, on a
real local cluster (`tide cluster up`, real processes and sockets).

- a reset to earliest, latest, an offset or a time (epoch ms and ISO-8601) makes the group's next
  consumer start exactly there; `--dry-run` and `--queue` change nothing else;
- a reset is refused while a member is live (GROUP_IN_USE, offsets unchanged) and accepted with
  `--force`, after which the live member reads again from the new offset;
- bad input (unknown group or topic, offsets outside a queue, an unreadable time) is one clear
  line with its typed code, and changes nothing;
- `tide group describe --json` gives the queues and, per member, the queues it holds and their lag;
- a delete leaves no committed offset, a new consumer starts from its configured start, and the
  delete holds on the new master after the old one is killed, and on the old one once it rejoins;
- a member closing while its master is killed commits on the new master before it leaves: the
  group's next member starts after what it was given.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from crc32c import crc32c

from tests.brokers import BrokerClient
from tests.client.conftest import LocalCluster, tide
from tidelog.client import Client, ConsumedMessage, OutMessage
from tidelog.drill.killmaster import describe_set

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=20.0) as c:
        yield c


def run(cluster: LocalCluster, *args: str) -> Any:
    """`tide ARGS --json` against the cluster; it must succeed with one JSON document."""
    out = tide(*args, "--controllers", cluster.controllers, "--json", timeout=120)
    assert out.returncode == 0, f"tide {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
    assert "Traceback" not in out.stderr
    return json.loads(out.stdout)


def refused(cluster: LocalCluster, code: str, *args: str) -> str:
    """`tide ARGS` must fail with one line on stderr carrying the typed error's code."""
    out = tide(*args, "--controllers", cluster.controllers, timeout=120)
    assert out.returncode != 0, f"tide {' '.join(args)} succeeded: {out.stdout}"
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and code in lines[0], f"expected one {code} line, got:\n{out.stderr}"
    return lines[0]


def committed(client: Client, group: str, topic: str) -> dict[tuple[str, int], int | None]:
    """The group's committed offset per queue, as `tide group describe` reads it (the same
    admin call, made in this process: the commands under test are the resets and deletes, and a
    `tide` process per check cost more CPU than the rest of the test)."""
    rows = client.admin().group_lag(group, topic)
    return {(r["broker_set"], r["queue"]): r["committed"] for r in rows}


def fill(client: Client, topic: str, bodies: list[str], queues: int = 1) -> None:
    client.admin().create_topic(topic, queues=queues)
    send(client, topic, bodies)


def send(client: Client, topic: str, bodies: list[str]) -> None:
    # one key per queue's worth of messages keeps them in order in a known queue
    client.producer().send_batch(topic, [OutMessage(b.encode(), "k") for b in bodies])


def wait_for(what: str, done: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := done()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.1)
    return got


def first_read(cluster: LocalCluster, group: str, topic: str, *, start: str = "latest") -> ConsumedMessage:
    """The first message a new member of `group` reads (it commits past it as it closes)."""
    with Client(cluster.controllers) as c, c.consumer(group=group, topic=topic, start=start) as cons:
        msgs: list[ConsumedMessage] = wait_for(
            f"a message for {group}", lambda: cons.poll(max_messages=1, timeout=0.5)
        )
        return msgs[0]


def read_all(cluster: LocalCluster, group: str, topic: str, n: int) -> None:
    """A member of `group` reads `n` messages from the start, commits and leaves."""
    with Client(cluster.controllers) as c, c.consumer(group=group, topic=topic, start="earliest") as cons:
        got: list[ConsumedMessage] = []
        wait_for(
            f"{n} messages for {group}",
            lambda: got.extend(cons.poll(max_messages=n, timeout=0.5)) or len(got) >= n,
        )
        assert len(got) == n
        cons.commit()


def test_each_reset_target_is_where_the_next_consumer_starts(cluster: LocalCluster, client: Client) -> None:
    fill(client, "rs", [f"a{i}" for i in range(10)])
    time.sleep(0.3)
    middle = int(time.time() * 1000)
    time.sleep(0.3)
    send(client, "rs", [f"b{i}" for i in range(10)])
    read_all(cluster, "rs-g", "rs", 20)
    q = ("broker-a", 0)
    assert committed(client, "rs-g", "rs") == {q: 20}

    plan = run(cluster, "group", "reset-offsets", "rs-g", "--topic", "rs", "--to", "earliest", "--dry-run")
    assert plan["queues"] == [{"broker_set": "broker-a", "queue": 0, "before": 20, "after": 0}]
    assert committed(client, "rs-g", "rs") == {q: 20}, "a dry run changed the offsets"

    run(cluster, "group", "reset-offsets", "rs-g", "--topic", "rs", "--to", "earliest")
    assert committed(client, "rs-g", "rs") == {q: 0}
    assert first_read(cluster, "rs-g", "rs").body == b"a0"

    run(cluster, "group", "reset-offsets", "rs-g", "--topic", "rs", "--to", "offset", "--offset", "5")
    first = first_read(cluster, "rs-g", "rs")
    assert (first.body, first.offset) == (b"a5", 5)

    out = run(
        cluster,
        "group",
        "reset-offsets",
        "rs-g",
        "--topic",
        "rs",
        "--to",
        "timestamp",
        "--timestamp",
        str(middle),
    )
    assert out["queues"][0]["after"] == 10
    assert first_read(cluster, "rs-g", "rs").body == b"b0"

    iso = dt.datetime.fromtimestamp(middle / 1000, dt.UTC).isoformat(timespec="milliseconds")
    run(cluster, "group", "reset-offsets", "rs-g", "--topic", "rs", "--to", "timestamp", "--timestamp", iso)
    assert first_read(cluster, "rs-g", "rs").body == b"b0"

    run(cluster, "group", "reset-offsets", "rs-g", "--topic", "rs", "--to", "latest")
    assert committed(client, "rs-g", "rs") == {q: 20}
    send(client, "rs", ["c0"])
    assert first_read(cluster, "rs-g", "rs", start="earliest").body == b"c0"


def test_a_reset_limited_to_one_queue_moves_only_that_queue(cluster: LocalCluster, client: Client) -> None:
    client.admin().create_topic("rq", queues=2)
    # a key maps to queue crc32c(key) % 2 (client/routing.py): one key for each queue
    keys = {crc32c(k.encode()) % 2: k for k in ("k0", "k1", "k2", "k3", "k4", "k5")}
    client.producer().send_batch("rq", [OutMessage(b"m%d" % i, keys[i % 2]) for i in range(10)])
    read_all(cluster, "rq-g", "rq", 10)
    before = committed(client, "rq-g", "rq")
    assert before == {("broker-a", 0): 5, ("broker-a", 1): 5}
    out = run(
        cluster,
        "group",
        "reset-offsets",
        "rq-g",
        "--topic",
        "rq",
        "--to",
        "offset",
        "--offset",
        "2",
        "--queue",
        "1",
        "--broker-set",
        "broker-a",
    )
    assert [(r["queue"], r["after"]) for r in out["queues"]] == [(1, 2)]
    assert committed(client, "rq-g", "rq") == {("broker-a", 0): 5, ("broker-a", 1): 2}


def test_a_live_member_refuses_a_reset_unless_forced(cluster: LocalCluster, client: Client) -> None:
    fill(client, "lv", [f"m{i}" for i in range(20)])
    with Client(cluster.controllers) as c:
        # a session of 30 s: the member stays live while the commands start, and says so itself
        cons = c.consumer(
            group="lv-g", topic="lv", start="earliest", session_timeout=30.0, heartbeat_interval=0.2
        )
        try:
            got: list[ConsumedMessage] = []
            wait_for(
                "20 messages", lambda: got.extend(cons.poll(max_messages=20, timeout=0.5)) or len(got) >= 20
            )
            cons.commit()
            assert committed(client, "lv-g", "lv") == {("broker-a", 0): 20}

            doc = run(cluster, "group", "describe", "lv-g", "--topic", "lv")
            (member,) = doc["members"]
            assert member == {
                "member": cons.member_id,
                "queues": ["broker-a/0"],
                "lag": 0,
                "live": True,
                "mode": "clustering",
            }
            assert doc["queues"][0]["owner"] == cons.member_id
            assert doc["queues"][0]["committed"] == 20  # the command shows what `committed` reads

            line = refused(
                cluster, "GROUP_IN_USE", "group", "reset-offsets", "lv-g", "--topic", "lv", "--to", "earliest"
            )
            assert cons.member_id in line and "--force" in line
            refused(cluster, "GROUP_IN_USE", "group", "delete", "lv-g")
            assert committed(client, "lv-g", "lv") == {("broker-a", 0): 20}, "a refusal changed offsets"
            dry = ["group", "reset-offsets", "lv-g", "--topic", "lv", "--to", "earliest", "--dry-run"]
            plan = run(cluster, *dry)  # a dry run writes nothing: live members do not stop it
            assert plan["live_members"] == [cons.member_id] and plan["queues"][0]["after"] == 0
            assert committed(client, "lv-g", "lv") == {("broker-a", 0): 20}, "a dry run changed offsets"

            out = run(
                cluster,
                "group",
                "reset-offsets",
                "lv-g",
                "--topic",
                "lv",
                "--to",
                "offset",
                "--offset",
                "7",
                "--force",
            )
            assert out["live_members"] == [cons.member_id]
            assert committed(client, "lv-g", "lv") == {("broker-a", 0): 7}
            # the live member drops its queue and takes it again from the new offset
            again: list[ConsumedMessage] = wait_for(
                "the member to read again", lambda: cons.poll(max_messages=1, timeout=0.5)
            )
            assert (again[0].body, again[0].offset) == (b"m7", 7)
        finally:
            cons.close()


def test_bad_input_is_one_typed_line_and_changes_nothing(cluster: LocalCluster, client: Client) -> None:
    fill(client, "bad", [f"m{i}" for i in range(10)])
    read_all(cluster, "bad-g", "bad", 10)
    before = committed(client, "bad-g", "bad")
    reset = ["group", "reset-offsets", "bad-g", "--topic", "bad"]
    refused(
        cluster, "GROUP_NOT_FOUND", "group", "reset-offsets", "nobody", "--topic", "bad", "--to", "earliest"
    )
    refused(cluster, "GROUP_NOT_FOUND", "group", "delete", "nobody")
    refused(cluster, "RESET_OFFSET_OUT_OF_RANGE", *reset, "--to", "offset", "--offset", "-1")
    line = refused(cluster, "RESET_OFFSET_OUT_OF_RANGE", *reset, "--to", "offset", "--offset", "11")
    assert "broker-a/0 holds 0..10" in line
    refused(cluster, "INVALID_ARGUMENT", *reset, "--to", "timestamp", "--timestamp", "yesterday")
    refused(cluster, "INVALID_ARGUMENT", *reset, "--to", "timestamp")
    refused(cluster, "INVALID_ARGUMENT", *reset, "--to", "earliest", "--broker-set", "nosuch")
    refused(
        cluster, "TOPIC_NOT_FOUND", "group", "reset-offsets", "bad-g", "--topic", "nosuch", "--to", "earliest"
    )
    refused(cluster, "TOPIC_NOT_FOUND", "group", "delete", "bad-g", "--topic", "nosuch")
    assert committed(client, "bad-g", "bad") == before == {("broker-a", 0): 10}


def _master(cluster: LocalCluster, client: Client) -> dict[str, Any]:
    """The master broker's process entry (name, pid, address) from `tide cluster up`'s state, as
    the controller names it now (asked in this process: the wait below asks every 0.1 s, and a
    `tide` process per question would cost more CPU than the failover takes)."""
    info = describe_set(client, "broker-a")
    if info is None or not info.role.has_master:
        return {}
    return next(p for p in cluster.state()["processes"] if p.get("address") == info.role.master_address)


def test_a_delete_holds_across_a_failover(cluster: LocalCluster, client: Client) -> None:
    fill(client, "dl", [f"m{i}" for i in range(12)])
    read_all(cluster, "dl-g", "dl", 12)
    read_all(cluster, "keep-g", "dl", 12)
    out = run(cluster, "group", "delete", "dl-g")
    assert [(d["topic"], d["queue"], d["offset"]) for d in out["deleted"]] == [("dl", 0, 12)]
    # nothing is left of it: unknown to describe as to a second delete
    refused(cluster, "GROUP_NOT_FOUND", "group", "describe", "dl-g", "--topic", "dl")
    refused(cluster, "GROUP_NOT_FOUND", "group", "delete", "dl-g")

    old = _master(cluster, client)
    os.kill(old["pid"], signal.SIGKILL)
    wait_for("another master", lambda: _master(cluster, client).get("name") not in (None, old["name"]), 60)
    # ...and serving as one: the controller names it before it takes the role (at its next
    # heartbeat), and a member's closing commit sent before that would be deferred, then dropped
    new = BrokerClient(_master(cluster, client)["address"])
    try:
        wait_for("the new master to take its role", lambda: _role(new) == "master", 30)
    finally:
        new.close()
    # still no commit after the failover: the group is still unknown
    refused(cluster, "GROUP_NOT_FOUND", "group", "describe", "dl-g", "--topic", "dl")
    assert committed(client, "keep-g", "dl") == {("broker-a", 0): 12}
    # with no commit, a new member starts where it is configured to: the earliest message
    assert first_read(cluster, "dl-g", "dl", start="earliest").body == b"m0"

    # the old master rejoins as a slave and folds the same: the tombstone, then the new commit
    out = tide("cluster", "restart", old["name"], "--data-dir", str(cluster.data_dir), "--json")
    assert out.returncode == 0, out.stderr
    rejoined = BrokerClient(old["address"])
    try:
        wait_for("the old master to catch up", lambda: _fetch(rejoined, "dl-g") == 1, 60)
        assert _fetch(rejoined, "keep-g") == 12
    finally:
        rejoined.close()


def _role(broker: BrokerClient) -> str:
    """The broker's own role ("" while it does not answer yet)."""
    try:
        return str(broker.status().role)
    except Exception:  # not answering yet
        return ""


def _fetch(broker: BrokerClient, group: str) -> int | None:
    try:
        return broker.fetch(group, "dl", 0)
    except Exception:  # not serving yet while it starts and rejoins
        return -1


def test_a_member_closing_during_a_failover_commits_on_the_new_master(
    cluster: LocalCluster, client: Client
) -> None:
    fill(client, "cf", [f"c{i}" for i in range(12)])
    with Client(cluster.controllers) as c:
        cons = c.consumer(group="cf-g", topic="cf", start="earliest", auto_commit_interval=3600)
        got: list[ConsumedMessage] = []
        wait_for(
            "6 messages",
            lambda: got.extend(cons.poll(max_messages=6 - len(got), timeout=0.5)) or len(got) >= 6,
        )
        assert [m.body for m in got] == [f"c{i}".encode() for i in range(6)]
        old = _master(cluster, client)
        os.kill(old["pid"], signal.SIGKILL)
        # the close's commit meets no master (the old one is dead, the new one not yet elected or
        # not yet serving): it is offered again until the new master takes it
        cons.close()
    try:
        # the group's next member starts after what the closed one was given, not at the start
        assert first_read(cluster, "cf-g", "cf", start="earliest").body == b"c6"
    finally:
        out = tide("cluster", "restart", old["name"], "--data-dir", str(cluster.data_dir), "--json")
        assert out.returncode == 0, out.stderr
        rejoined = BrokerClient(old["address"])
        try:
            wait_for(
                "the old master to take a role again", lambda: _role(rejoined) in ("master", "slave"), 60
            )
        finally:
            rejoined.close()
