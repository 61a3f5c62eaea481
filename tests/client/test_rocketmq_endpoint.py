"""The official RocketMQ Python client, unmodified, against the brokers' RocketMQ endpoint of a
cluster started by `tide cluster up` (broker/rocketmq.py): two broker sets of two replicas, a
topic with queues in both (tests/client/rocketmq_cluster.py) unless a test waits on a redelivery
or on a held message, where the topic is in one set, the client given one broker's endpoint. The
client runs in its own process (tests/client/rocketmq_driver.py): its generated modules and
tidelog's share protobuf names.

Drives stop on what they wait for: a SimpleConsumer takes a topic's queues in turn, four of one
set before the next set's, and waits out a long poll on each empty one, so a test that waits for
a message to come back uses a topic in one set, and receives end after one empty long poll."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster
from tidelog.client import modes
from tidelog.client.aio import AsyncClient
from tidelog.errors import TopicNotFoundError

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("rocketmq_driver.py")


def drive(
    *args: str, timeout: float = 180, driver: Path = DRIVER, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a driver of the official client (a process of its own, with `env` added to this
    one's environment); its last line's JSON."""
    out = subprocess.run(
        [sys.executable, str(driver), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with rc.two_sets(tmp_path_factory.mktemp("rmq")) as c:
        yield c


@pytest.fixture(scope="module")
def endpoint(cluster: LocalCluster) -> str:
    """One slave's RocketMQ endpoint, as `tide cluster status --json` names it: the client's one
    address for the whole cluster (a slave's: every call it makes is passed on to a master)."""
    assert all(m["rocketmq_endpoint"] for m in rc.members(cluster))
    return rc.endpoint(cluster, "broker-a", "slave")


create_topic = rc.create_topic


def create_one_queue_topic(cluster: LocalCluster, name: str) -> None:
    """Topic `name` with one queue, in broker-a only: every receive of a SimpleConsumer asks for
    that queue (the client takes a topic's queues in turn, four of one set before the next set's,
    and each receive of a set with nothing waits out its long poll), so a message is received as
    soon as it is visible again, not when the consumer's turn comes back to its set."""
    rc.create_topic_in(cluster, name, "broker-a", queues=1)


#: A `receive` drive stops once it has what it expects and then each of its receivers' next
#: receive (a long poll of 1 s; several at once, on both broker sets) came back empty.
UNTIL_EMPTY = ("1", "1")


def test_sends_are_readable_through_tidelog_and_received_by_a_simple_consumer(
    cluster: LocalCluster, endpoint: str
) -> None:
    create_topic(cluster, "rmq-orders")
    sent = drive(endpoint, "send", "rmq-orders", "200", "100")
    receipts = sent["sent"]
    assert len(receipts) == 300 and len({r["id"] for r in receipts}) == 300
    # a topic no one created: the send fails (the client reports the route it could not get)
    assert sent["unknown_topic_errors"], "a send to a missing topic must fail"

    async def read_back() -> list[Any]:
        async with AsyncClient(cluster.controllers) as client:
            return await asyncio.gather(*(client.get_message_by_id(r["id"]) for r in receipts))

    for r, m in zip(receipts, asyncio.run(read_back()), strict=True):
        i = r["i"]
        assert m.topic == "rmq-orders"
        assert m.body == f"body-{i}".encode()
        assert m.tags == ("a", "b", "c")[i % 3]
        assert m.key == f"key-{i}"
        assert m.properties["seq"] == str(i)
        assert m.properties["rmq.keys"] == f"key-{i}"

    got = drive(endpoint, "receive", "rmq-orders", "g-all", "300", "*", *UNTIL_EMPTY)["received"]
    assert sorted(m["id"] for m in got) == sorted(r["id"] for r in receipts)  # each once
    by_id = {r["id"]: r["i"] for r in receipts}
    for m in got:
        i = by_id[m["id"]]
        assert (m["body"], m["tag"], m["keys"], m["properties"], m["attempt"]) == (
            f"body-{i}",
            ("a", "b", "c")[i % 3],
            [f"key-{i}"],
            {"seq": str(i)},
            1,
        )
    # all acknowledged: nothing comes back
    assert drive(endpoint, "receive", "rmq-orders", "g-all", "0", "*", *UNTIL_EMPTY)["received"] == []

    # a tag filter: only a||c, each once (the b messages are skipped for this group)
    tagged = drive(endpoint, "receive", "rmq-orders", "g-tags", "200", "a||c", *UNTIL_EMPTY)["received"]
    assert sorted(m["id"] for m in tagged) == sorted(r["id"] for r in receipts if r["i"] % 3 != 1)


def test_a_waiting_receive_answers_a_message_sent_to_any_queue_of_its_broker_set(
    cluster: LocalCluster, endpoint: str
) -> None:
    """A receive reads every queue of the broker set it names and wakes on the first message in
    any of them: each message, sent while the consumer waits in a 20 s long poll, is received long
    before the poll would end (the topic is in one set: a receive waits on the set it names)."""
    rc.create_topic_in(cluster, "rmq-wake", "broker-a", queues=8)
    # each sent 0.2 s after the consumer went back into its receive
    woken = drive(endpoint, "wake", "rmq-wake", "g-wake", "16", "0.2", timeout=600)
    out = woken["messages"]
    assert len(out) == 16

    async def queues() -> set[int]:
        async with AsyncClient(cluster.controllers) as client:
            return {(await client.get_message_by_id(m["id"])).queue for m in out}

    assert asyncio.run(queues()) == set(range(8))  # the messages went to every queue
    print("send to receipt by a waiting consumer:", sorted(round(m["after"], 3) for m in out))
    assert all(m["after"] < 5.0 for m in out), woken  # not the 20 s long poll


def test_an_unacknowledged_message_comes_back_after_its_invisible_duration(
    cluster: LocalCluster, endpoint: str
) -> None:
    create_one_queue_topic(cluster, "rmq-retry")
    (receipt,) = drive(endpoint, "send", "rmq-retry", "1", "0")["sent"]
    first, second = drive(endpoint, "redeliver", "rmq-retry", "g-retry")["rounds"]
    assert first["id"] == second["id"] == receipt["id"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert second["at"] - first["at"] >= 1.5  # not before its invisible duration (2 s) ran out


def test_bad_input_and_unserved_calls_answer_rocketmq_codes(cluster: LocalCluster, endpoint: str) -> None:
    create_topic(cluster, "rmq-raw")
    other = rc.endpoint(cluster, "broker-b", "master")
    out = drive(endpoint, "raw", "rmq-raw", other)
    assert out["unknown_topic"] == "TOPIC_NOT_FOUND"
    assert out["bad_topic_name"] == "ILLEGAL_TOPIC"
    assert out["bad_receipt"] == "INVALID_RECEIPT_HANDLE"
    assert out["end_transaction"] == "ILLEGAL_TOPIC"  # served now: an empty request names no topic
    assert sorted((q["broker"], q["queue"], q["broker_id"]) for q in out["route"]) == [
        (name, q, 0) for name in rc.SETS for q in range(rc.QUEUES_PER_SET)
    ]
    # as RocketMQ's proxy: every queue names the endpoint the client asked through, whichever
    # set it is in (the endpoint passes calls on to the queue's master)
    assert all(q["endpoints"] == [endpoint] for q in out["route"]), out["route"]
    # several addresses (a;b): those, for failover across them
    assert out["route_of_two"] == [[endpoint, other]] * len(out["route"]), out["route_of_two"]


def test_a_message_forwarded_to_the_dead_letter_queue_moves_there_once_and_never_comes_back(
    cluster: LocalCluster, endpoint: str
) -> None:
    create_one_queue_topic(cluster, "rmq-dead")
    (sent,) = drive(endpoint, "send", "rmq-dead", "1", "0")["sent"]
    # received invisible for 3 s, and watched for 4 s after the forward: a message the forward
    # did not finish for the group would come back within it
    out = drive(endpoint, "forward", "rmq-dead", "g-dead", "3", "4")
    assert out["message"]["id"] == sent["id"]
    assert out["forward"] == "OK", out["forward_message"]
    assert out["again"] == "INVALID_RECEIPT_HANDLE"  # finished: the receipt is stale
    assert out["later"] == []  # finished for the group: not delivered again, even once its 3 s ran out

    async def dead_letters() -> list[Any]:
        async with AsyncClient(cluster.controllers) as client:
            got = []
            for broker_set in rc.SETS:  # the dead-letter topic has a queue in each set
                with contextlib.suppress(TopicNotFoundError):
                    reader = client.reader(modes.dlq_topic("g-dead"), 0, broker_set=broker_set)
                    got += await reader.read(max_messages=10, timeout=1)
            return got

    (letter,) = asyncio.run(dead_letters())
    assert letter.body == b"body-0" and letter.tags == "a" and letter.key == "key-0"
    props = letter.properties
    assert props[modes.ORIGIN_TOPIC] == "rmq-dead" and props[modes.ORIGIN_MESSAGE_ID] == sent["id"]
    assert props[modes.DELIVERY_ATTEMPTS] == "1"
    assert props["seq"] == "0"  # the message's own properties travel with it


def check_fifo(events: list[dict[str, Any]], groups: int, per_group: int) -> None:
    """Each message group's messages went out in send order, one at a time: a message was
    delivered only once every earlier one of its group was acknowledged, and each was
    acknowledged once."""
    acked: dict[str, list[int]] = {f"g{g}": [] for g in range(groups)}
    for e in events:
        group, _, seq = e["body"].partition("-")
        assert e["group"] == group, e
        if e["event"] == "receive":
            assert acked[group] == list(range(int(seq))), (e, acked[group])
        else:
            acked[group].append(int(seq))
    assert acked == {f"g{g}": list(range(per_group)) for g in range(groups)}


def test_fifo_messages_go_out_in_group_order_across_a_consumer_restart(
    cluster: LocalCluster, endpoint: str
) -> None:
    groups, per_group = 3, 8
    # 8 queues in one broker set: each receive of the SimpleConsumer asks the set that holds the
    # groups (over two sets, it asked the other set's four queues in turn, each a long poll)
    rc.create_topic_in(cluster, "rmq-fifo", "broker-a", queues=8)
    sent = drive(endpoint, "fifo-send", "rmq-fifo", str(groups), str(per_group))["sent"]
    assert len({s["id"] for s in sent}) == groups * per_group
    # the first consumer acknowledges 7 messages, keeps the next ones unacknowledged (3 s
    # invisible) and stops; a second consumer of the group takes over
    first = drive(endpoint, "fifo-receive", "rmq-fifo", "g-fifo", "0", "7", "2", "3")["events"]
    acked_first = sum(1 for e in first if e["event"] == "ack")
    acked = {e["body"] for e in first if e["event"] == "ack"}
    held: dict[str, int] = {}  # body -> its last delivery by the first consumer (a held message
    for e in first:  # whose 3 s ran out while the first consumer went on came back to it)
        if e["event"] == "receive" and e["body"] not in acked:
            held[e["body"]] = e["attempt"]
    assert acked_first == 7 and len(held) >= 1, first
    rest = str(groups * per_group - acked_first)
    # long polls of 1 s: the held messages come back only once their 3 s ran out
    second = drive(endpoint, "fifo-receive", "rmq-fifo", "g-fifo", rest, "0", "0", "15", "1")["events"]
    check_fifo(first + second, groups, per_group)
    # what the first consumer held came back to the second, as its next delivery
    again = {e["body"]: e["attempt"] for e in second if e["event"] == "receive"}
    assert all(again[body] == attempt + 1 for body, attempt in held.items()), (held, again)


def test_a_push_consumer_gets_each_fifo_group_in_send_order(cluster: LocalCluster, endpoint: str) -> None:
    """The push consumer's listener runs messages on a pool of threads: with a group's messages
    handed out one at a time, each group reaches it in send order, each message once the one
    before it was processed (the listener takes 0.3 s over each)."""
    groups, per_group = 3, 8
    create_topic(cluster, "rmq-fifo-push")
    drive(endpoint, "fifo-send", "rmq-fifo-push", str(groups), str(per_group))
    total = str(groups * per_group)
    # quiet for 1.5 s once all came: a message handed out twice would have come within it
    args = ("push", "rmq-fifo-push", "g-fifo-push", total, "0", "1.5", "0.3")
    deliveries = drive(endpoint, *args)["deliveries"]
    order: dict[str, list[dict[str, Any]]] = {f"g{g}": [] for g in range(groups)}
    for d in deliveries:
        order[d["body"].partition("-")[0]].append(d)
    for g, got in order.items():
        assert [d["body"] for d in got] == [f"{g}-{n}" for n in range(per_group)]
        for before, after in zip(got, got[1:], strict=False):
            assert after["at"] >= before["done"], (before, after)


def test_change_invisible_duration_moves_the_redelivery_and_gives_a_new_receipt_handle(
    cluster: LocalCluster, endpoint: str
) -> None:
    create_one_queue_topic(cluster, "rmq-invisible")
    drive(endpoint, "send", "rmq-invisible", "2", "0")
    out = drive(endpoint, "change-invisible", "rmq-invisible", "g-invisible", "3", "6")
    first, second = out["first"], out["second"]
    assert (first["attempt"], second["attempt"]) == (1, 1)
    # the second: the old handle is stale once changed; the new one acknowledged it (the
    # driver raises otherwise) and it never came back
    assert out["handle_changed"] and out["old_handle_ack"] == "INVALID_RECEIPT_HANDLE"
    (back,) = out["later"]
    assert back["id"] == first["id"] and back["body"] == first["body"] and back["attempt"] == 2
    # not at the end of its first invisible duration (3 s) but of the longer one (6 s, from
    # the change); bounded: it does come back
    waited = back["at"] - out["changed_at"][0]
    assert 5.0 <= waited <= 40, waited
