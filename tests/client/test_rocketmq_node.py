"""The official RocketMQ Node.js client (rocketmq-client-nodejs from npm, unmodified; `make test`
installs it from tests/client/node/package-lock.json) against the brokers' RocketMQ endpoint: two
broker sets of two replicas, every topic with queues in both (tests/client/rocketmq_cluster.py),
the client given one slave's endpoint for the whole cluster. Each test runs the client in a Node
process of its own (tests/client/node/driver.js).

The brokers give RocketMQ groups a short retry policy and check orphaned transactions after 3 s,
so that retries, dead letters and checks take seconds."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster
from tests.client.test_rocketmq_endpoint import check_fifo
from tidelog.client import modes
from tidelog.client.aio import AsyncClient, ConsumedMessage

NODE_DIR = Path(__file__).with_name("node")
DRIVER = NODE_DIR / "driver.js"
INSTALLED = (NODE_DIR / "node_modules" / "rocketmq-client-nodejs" / "package.json").exists()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("node") is None or not INSTALLED,
        reason="needs node and `npm ci` in tests/client/node (make test does both)",
    ),
]

MAX_ATTEMPTS = 4
BACKOFF_S = [1, 2, 3]
CHECK_INTERVAL_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with rc.two_sets(
        tmp_path_factory.mktemp("rmqnode"),
        rocketmq_max_delivery_attempts=MAX_ATTEMPTS,
        rocketmq_retry_backoff_s=BACKOFF_S,
        rocketmq_tx_check_interval_ms=int(CHECK_INTERVAL_S * 1000),
        rocketmq_tx_max_checks=40,
    ) as c:
        yield c


#: The Node processes' environment: the client logs into files under $HOME, here a test directory.
ENV: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def node_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    ENV.update(os.environ, HOME=str(tmp_path_factory.mktemp("node-home")))
    yield
    ENV.clear()


@pytest.fixture(scope="module")
def endpoint(cluster: LocalCluster) -> str:
    """The client's one address: a slave of broker-a, so that every call is passed on to a master."""
    return rc.endpoint(cluster, "broker-a", "slave")


def node(endpoint: str, command: str, args: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    """Run the Node driver (a process of its own); its last line's JSON."""
    out = subprocess.run(
        ["node", str(DRIVER), endpoint, command, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=NODE_DIR,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


async def _by_ids(cluster: LocalCluster, ids: list[str]) -> list[ConsumedMessage]:
    async with AsyncClient(cluster.controllers) as client:
        return list(await asyncio.gather(*(client.get_message_by_id(i) for i in ids)))


def test_normal_messages_reach_both_broker_sets_and_a_simple_consumer_gets_each_once(
    cluster: LocalCluster, endpoint: str
) -> None:
    rc.create_topic(cluster, "node-orders")
    out = node(endpoint, "send", {"topic": "node-orders", "count": 40})
    sent = out["sent"]
    assert len({s["id"] for s in sent}) == 40
    # one address for the cluster, and the messages are in the queues of both sets (the endpoint
    # places them as tidelog's producer does, by key: this client offers queue 0 of each broker
    # only, as it keeps the queues whose id, not whose broker id, is 0)
    assert {s["broker"] for s in sent} == set(rc.SETS)
    placed = {(m.broker_set, m.queue) for m in asyncio.run(_by_ids(cluster, [s["id"] for s in sent]))}
    assert placed == {(b, q) for b in rc.SETS for q in range(rc.QUEUES_PER_SET)}, placed
    assert out["unknown_topic"] is not None, "a send to a missing topic must fail"

    got = node(endpoint, "receive", {"topic": "node-orders", "group": "g-node", "expected": 40})["received"]
    assert sorted(m["id"] for m in got) == sorted(s["id"] for s in sent)  # each once
    by_id = {s["id"]: s["i"] for s in sent}
    for m in got:
        i = by_id[m["id"]]
        assert (m["body"], m["tag"], m["keys"], m["properties"], m["attempt"]) == (
            f"body-{i}",
            ("a", "b", "c")[i % 3],
            [f"key-{i}"],
            {"seq": str(i)},
            1,
        )
    # a tag filter: a||c only, each once
    args = {"topic": "node-orders", "group": "g-node-tags", "expected": 27, "filter": "a||c"}
    tagged = node(endpoint, "receive", args)["received"]
    assert sorted(m["id"] for m in tagged) == sorted(s["id"] for s in sent if s["i"] % 3 != 1)


def test_fifo_groups_are_received_in_send_order(cluster: LocalCluster, endpoint: str) -> None:
    groups, per_group = 4, 6
    rc.create_topic(cluster, "node-fifo")
    sent = node(endpoint, "fifo-send", {"topic": "node-fifo", "groups": groups, "perGroup": per_group})[
        "sent"
    ]
    assert len({s["id"] for s in sent}) == groups * per_group
    args = {"topic": "node-fifo", "group": "g-node-fifo", "expected": groups * per_group}
    events = node(endpoint, "fifo-receive", args)["events"]
    check_fifo(events, groups, per_group)


def test_delayed_messages_arrive_at_their_time_and_a_recalled_one_never(
    cluster: LocalCluster, endpoint: str
) -> None:
    rc.create_topic(cluster, "node-delay")
    out = node(endpoint, "delay-send", {"topic": "node-delay", "delaysS": [3, 2, 3], "recall": [2]})
    sent, recalled = out["sent"], out["recalled"]
    assert all(s["handle"] for s in sent), "every delayed message has a recall handle"
    assert recalled == {"2": {"id": sent[2]["id"]}}, recalled
    # received well past the recalled message's time: it never comes
    args = {"topic": "node-delay", "group": "g-node-delay", "expected": 2, "seconds": 12}
    got = node(endpoint, "receive", args)["received"]
    assert sorted(m["id"] for m in got) == sorted(s["id"] for s in sent[:2])
    times = {s["id"]: s["at"] for s in sent}
    assert all(m["at"] >= times[m["id"]] for m in got), "not before its delivery time"
    # delivered (or recalled already): its recall is refused as RocketMQ's proxy refuses a late one,
    # INTERNAL_SERVER_ERROR (50001) "recall failed, timestamp invalid"
    late = node(endpoint, "recall", {"topic": "node-delay", "handle": sent[0]["handle"]})
    assert "code: 50001" in late.get("message", "") and "timestamp invalid" in late["message"], late
    again = node(endpoint, "recall", {"topic": "node-delay", "handle": sent[2]["handle"]})
    assert "code: 50001" in again.get("message", ""), again


def test_transactions_commit_rollback_and_orphans_checked_back(cluster: LocalCluster, endpoint: str) -> None:
    rc.create_topic(cluster, "node-tx")
    out = node(endpoint, "transactions", {"topic": "node-tx", "stayS": CHECK_INTERVAL_S + 8})
    checked = {c["body"]: c for c in out["checks"]}
    assert sorted(checked) == ["orphan-commit", "orphan-rollback"], out["checks"]
    for body, c in checked.items():
        assert c["id"] == out[body]["id"], "the checker gets the message id its producer was given"
        assert c["at"] >= out["sent_at"] + (CHECK_INTERVAL_S - 1) * 1000
    args = {"topic": "node-tx", "group": "g-node-tx", "expected": 2, "seconds": 2 * CHECK_INTERVAL_S + 2}
    got = node(endpoint, "receive", args)["received"]
    assert sorted((m["body"], m["id"]) for m in got) == [
        ("commit", out["commit"]["id"]),
        ("orphan-commit", out["orphan-commit"]["id"]),
    ]


def test_a_push_consumer_retries_failures_into_the_dead_letter_queue(
    cluster: LocalCluster, endpoint: str
) -> None:
    rc.create_topic(cluster, "node-push")
    sent = node(endpoint, "send", {"topic": "node-push", "count": 30})["sent"]
    by_id = {s["id"]: s["i"] for s in sent}
    args = {
        "topic": "node-push",
        "group": "g-node-push",
        "expected": 30,
        "failEvery": 10,
        "quietS": BACKOFF_S[-1] + 3,
    }
    deliveries = node(endpoint, "push", args)["deliveries"]
    per_id: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for d in deliveries:
        per_id[d["id"]].append(d)
    assert set(per_id) == set(by_id)
    failing = {m for m, i in by_id.items() if i % 10 == 0}
    for message_id, ds in per_id.items():
        expected = list(range(1, MAX_ATTEMPTS + 1)) if message_id in failing else [1]
        assert [d["attempt"] for d in ds] == expected, ds
    letters = rc.dead_letters(cluster, "g-node-push", len(failing))
    assert sorted(m.properties[modes.ORIGIN_MESSAGE_ID] for m in letters) == sorted(failing)  # once each
    assert all(m.properties[modes.DELIVERY_ATTEMPTS] == str(MAX_ATTEMPTS) for m in letters)


def test_a_master_killed_under_a_producer_and_a_push_consumer_loses_no_receipted_message(
    cluster: LocalCluster, endpoint: str, tmp_path: Path
) -> None:
    """Runs last: it kills broker-a's master (the client's access point, broker-a's slave, lives
    on and becomes master) and restarts it as a slave."""
    rc.create_topic(cluster, "node-kill")
    victim = rc.member(cluster, "broker-a", "master")["name"]
    args = {
        "topic": "node-kill",
        "group": "g-node-kill",
        "seconds": 120,  # a bound: kill_master_under stops it through the stop file
        "readyFile": str(tmp_path / "ready"),
        "stopFile": str(tmp_path / "stop"),
        "progressFile": str(tmp_path / "progress"),
    }
    command = ["node", str(DRIVER), endpoint, "produce-consume", json.dumps(args)]
    out, killed_ms = rc.kill_master_under(cluster, victim, command, tmp_path, cwd=NODE_DIR, env=ENV)
    receipts, deliveries = out["receipts"], out["deliveries"]
    delivered = collections.Counter(d[0] for d in deliveries)
    lost = [r for r in receipts if r["id"] not in delivered]
    print(
        f"master killed under the Node client: {len(receipts)} receipted, {len(lost)} lost, "
        f"{sum(n - 1 for n in delivered.values())} duplicates, {len(out['send_failures'])} failed sends"
    )
    assert len(receipts) >= 40, out["send_failures"][-5:]
    after = [r for r in receipts if r["epochMs"] > killed_ms]
    assert len(after) >= 20, f"no send was receipted after the failover: {out['send_failures'][-5:]}"
    assert lost == [], f"{len(lost)} receipted messages never consumed: {lost[:5]}"
