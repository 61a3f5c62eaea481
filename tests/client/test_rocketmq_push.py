"""The official RocketMQ Python client's PushConsumer, 10,000 messages and a master killed under
an official producer and push consumer, against the brokers' RocketMQ endpoint
(broker/rocketmq.py): two broker sets of two replicas, every topic with queues in both
(tests/client/rocketmq_cluster.py). The client runs in its own process
(tests/client/rocketmq_driver.py).

The cluster's brokers give RocketMQ groups a short retry policy (`rocketmq_max_delivery_attempts`,
`rocketmq_retry_backoff_s`) so that a message's whole way to the dead-letter queue takes seconds.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster, tide
from tests.client.test_rocketmq_endpoint import DRIVER, create_topic, drive
from tidelog.broker import rocketmqrules as rules
from tidelog.client import modes
from tidelog.client.aio import AsyncClient, ConsumedMessage

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 4
BACKOFF_S = [1, 2, 3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two broker sets with a short RocketMQ retry policy."""
    with rc.two_sets(
        tmp_path_factory.mktemp("rmqpush"),
        rocketmq_max_delivery_attempts=MAX_ATTEMPTS,
        rocketmq_retry_backoff_s=BACKOFF_S,
    ) as c:
        yield c


def master_endpoint(cluster: LocalCluster) -> str:
    return rc.endpoint(cluster, "broker-a", "master")


async def by_ids(cluster: LocalCluster, ids: list[str]) -> list[ConsumedMessage]:
    """The messages of `ids`, looked up through tidelog's own client, 500 at a time."""
    out: list[ConsumedMessage] = []
    async with AsyncClient(cluster.controllers) as client:
        for at in range(0, len(ids), 500):
            out += await asyncio.gather(*(client.get_message_by_id(i) for i in ids[at : at + 500]))
    return out


def test_a_push_consumer_consumes_what_was_sent_and_retries_failures_into_the_dead_letter_queue(
    cluster: LocalCluster,
) -> None:
    endpoint = master_endpoint(cluster)
    create_topic(cluster, "rmq-push")
    sent = drive(endpoint, "send", "rmq-push", "40", "0")["sent"]
    by_id = {r["id"]: r["i"] for r in sent}

    # two groups at once, each with a push consumer of its own: one whose listener succeeds, one
    # whose listener fails every tenth message. Each stops once every message came and then none
    # for a while: 1.5 s (a message handed out twice comes at once), or past the last backoff
    # (a delivery after the last attempt would come within it)
    quiet = BACKOFF_S[-1] + 1.5
    with ThreadPoolExecutor(2) as pool:
        succeeding = pool.submit(drive, endpoint, "push", "rmq-push", "g-push-ok", "40", "0", "1.5")
        failing_every_tenth = pool.submit(
            drive, endpoint, "push", "rmq-push", "g-push-fail", "40", "10", str(quiet)
        )
        ok = succeeding.result()["deliveries"]
        # the group that acknowledged everything sent nothing to the dead-letter queue (looked at
        # while the failing group's consumer still runs)
        ok_letters = rc.dead_letters(cluster, "g-push-ok", 0)
        seen = failing_every_tenth.result()["deliveries"]

    # the listener that succeeds: each message once, as it was sent
    assert sorted(d["id"] for d in ok) == sorted(by_id)
    for d in ok:
        i = by_id[d["id"]]
        assert (d["body"], d["tag"], d["keys"], d["properties"], d["attempt"]) == (
            f"body-{i}",
            ("a", "b", "c")[i % 3],
            [f"key-{i}"],
            {"seq": str(i)},
            1,
        )

    # the listener that fails every tenth message: those come back after growing delays until the
    # last attempt, then move to the dead-letter queue, once, and are never delivered again
    per_id: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for d in seen:
        per_id[d["id"]].append(d)
    assert set(per_id) == set(by_id)
    failing = {m for m, i in by_id.items() if i % 10 == 0}
    for message_id, ds in per_id.items():
        i = by_id[message_id]
        assert all(d["body"] == f"body-{i}" for d in ds)
        if message_id not in failing:
            assert [d["attempt"] for d in ds] == [1]
            continue
        assert [d["attempt"] for d in ds] == list(range(1, MAX_ATTEMPTS + 1)), ds
        gaps = [b["at"] - a["at"] for a, b in zip(ds, ds[1:], strict=False)]
        assert gaps == sorted(gaps), f"backoff gaps of {message_id} shrink: {gaps}"
        for gap, backoff in zip(gaps, BACKOFF_S, strict=True):
            assert gap >= backoff - 0.3, f"{message_id} came back after {gap:.2f}s, before its {backoff}s"

    letters = rc.dead_letters(cluster, "g-push-fail", len(failing))
    assert sorted(m.properties[modes.ORIGIN_MESSAGE_ID] for m in letters) == sorted(failing)  # once each
    for m in letters:
        i = by_id[m.properties[modes.ORIGIN_MESSAGE_ID]]
        assert (m.body, m.tags, m.key) == (f"body-{i}".encode(), ("a", "b", "c")[i % 3], f"key-{i}")
        assert m.properties[modes.ORIGIN_TOPIC] == "rmq-push"
        assert m.properties[modes.DELIVERY_ATTEMPTS] == str(MAX_ATTEMPTS)
    assert ok_letters == []


def test_ten_thousand_sync_and_async_sends_are_readable_by_id_and_received_once(
    cluster: LocalCluster,
) -> None:
    endpoint = master_endpoint(cluster)
    create_topic(cluster, "rmq-10k")
    t0 = time.monotonic()
    sent = drive(endpoint, "send", "rmq-10k", "2000", "8000", timeout=300)["sent"]  # sync, then async
    t_send = time.monotonic() - t0
    assert sorted(r["i"] for r in sent) == list(range(10_000))
    assert len({r["id"] for r in sent}) == 10_000

    t0 = time.monotonic()
    found = asyncio.run(by_ids(cluster, [r["id"] for r in sent]))
    t_lookup = time.monotonic() - t0
    for r, m in zip(sent, found, strict=True):
        i = r["i"]
        assert (m.topic, m.body, m.tags, m.key) == (
            "rmq-10k",
            f"body-{i}".encode(),
            ("a", "b", "c")[i % 3],
            f"key-{i}",
        )
        assert m.properties["seq"] == str(i) and m.properties["rmq.keys"] == f"key-{i}"

    t0 = time.monotonic()
    out = drive(endpoint, "ack-all", "rmq-10k", "g-10k", "10000", timeout=400)
    t_receive = time.monotonic() - t0
    got = out["received"]
    assert out["ack_failures"] == 0
    assert sorted(g[0] for g in got) == sorted(r["id"] for r in sent)  # each exactly once
    bodies = {r["id"]: f"body-{r['i']}" for r in sent}
    assert all(body == bodies[message_id] and attempt == 1 for message_id, body, attempt in got)
    print(f"10,000 messages: send {t_send:.1f}s, lookup by id {t_lookup:.1f}s, receive+ack {t_receive:.1f}s")


def test_a_rocketmq_consumer_is_a_shared_member_of_its_group_until_it_shuts_down(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    create_topic(cluster, "rmq-members")
    ready = tmp_path / "ready"
    args = ["hold", "rmq-members", "g-members", "6", str(ready)]
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), master_endpoint(cluster), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def members() -> tuple[dict[str, str], dict[str, str]]:
        async with AsyncClient(cluster.controllers) as client:
            admin = client.admin()
            return await admin.group_members("g-members"), await admin.group_modes("g-members")

    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text()) and driver.poll() is None:
            assert time.monotonic() < deadline, "the driver did not start"
            time.sleep(0.1)
        me = rules.member_id(ready.read_text(), "rmq-members")
        live, modes_of = asyncio.run(members())
        while me not in live and time.monotonic() < deadline:
            time.sleep(0.3)
            live, modes_of = asyncio.run(members())
        assert live == {me: "rmq-members"} and modes_of[me] == modes.SHARED
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, stderr[-3000:]
    # it told the endpoint it was shutting down: no longer a member, at once
    assert asyncio.run(members()) == ({}, {})
    out = tide("group", "describe", "g-members", env={"TIDE_CONTROLLERS": cluster.controllers})
    assert out.returncode == 0 and "rmq-members" in out.stdout, out.stdout + out.stderr


def test_master_killed_under_an_official_producer_and_push_consumer_loses_no_receipted_message(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    create_topic(cluster, "rmq-kill")
    master = rc.member(cluster, "broker-a", "master")
    victim = master["name"]
    # two addresses, the one that dies first: the client fails over to the other (gRPC's
    # pick-first over both), which every queue's route names too
    access_point = f"{master['rocketmq_endpoint']};{rc.endpoint(cluster, 'broker-a', 'slave')}"
    command = [
        sys.executable,
        str(DRIVER),
        access_point,
        "produce-consume",
        "rmq-kill",
        "g-kill",
        "120",  # a bound: kill_master_under stops it through the stop file
        str(tmp_path / "ready"),
        str(tmp_path / "stop"),
        str(tmp_path / "progress"),
    ]
    out, killed_ms = rc.kill_master_under(cluster, victim, command, tmp_path)
    receipts, deliveries = out["receipts"], out["deliveries"]
    delivered = collections.Counter(d[0] for d in deliveries)
    lost = [r for r in receipts if r["id"] not in delivered]
    duplicates = sum(n - 1 for n in delivered.values())
    times = [r["at"] for r in receipts]
    gap = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)
    print(
        f"master killed: {len(receipts)} receipted, {len(lost)} lost, {duplicates} duplicate deliveries, "
        f"{len(out['send_failures'])} failed sends, longest gap between receipts {gap:.1f}s"
    )
    assert len(receipts) >= 40, out["send_failures"][-5:]
    after = [r for r in receipts if r["epochMs"] > killed_ms]
    assert len(after) >= 20, f"no send was receipted after the failover: {out['send_failures'][-5:]}"
    assert lost == [], f"{len(lost)} receipted messages never consumed: {lost[:5]}"
    bodies = {r["id"]: f"body-{r['i']}" for r in receipts}
    assert all(bodies[i] == body for i, body, _ in deliveries if i in bodies)
    assert duplicates <= len(receipts) // 2, "far more duplicates than a failover explains"
