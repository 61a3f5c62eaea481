"""Scenario: an application finds messages again on a real local cluster (processes, sockets):
by queue position, by the id its receipt carries and by key, through the client and `tide
message`; bad lookups get typed errors; after a kill -9 of the master the new master still finds
every acknowledged message by key (docs/ARCHITECTURE.md §6.6).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.client.conftest import LocalCluster, tide
from tidelog.client import Client, Receipt
from tidelog.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb

pytestmark = pytest.mark.slow

T = TypeVar("T")
TOPIC = "lookups"
KEYS = [f"order-{i}" for i in range(6)]


def eventually(fn: Callable[[], T], timeout: float = 20.0, what: str = "the lookup") -> T:
    """`fn()` once it stops raising MESSAGE_NOT_FOUND / UNAVAILABLE (a replica confirms a write
    within a heartbeat or two; a failover takes a heartbeat timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (MessageNotFoundError, TidelogError) as exc:
            if time.monotonic() > deadline or isinstance(exc, InvalidArgumentError):
                raise AssertionError(f"{what} kept failing: {exc}") from exc
            time.sleep(0.2)


def newest_first(sent: list[tuple[bytes, str, Receipt]], key: str) -> list[bytes]:
    # one key maps to one queue, whose order is the send order: newest first is the reverse
    return [body for body, k, _ in reversed(sent) if k == key]


def master_process(cluster: LocalCluster, client: Client) -> tuple[str, str]:
    """(process name, address) of the broker that says it is master."""
    for p in cluster.state()["processes"]:
        if p["kind"] != "broker":
            continue
        try:
            status = client.runner.run(client.aio.call_broker(p["address"], "Status", bpb.StatusRequest()))
        except UnavailableError:
            continue  # the killed one
        if status.role == "master":
            return p["name"], p["address"]
    raise UnavailableError("no broker is master")


def ok_json(*args: str) -> Any:
    out = tide(*args, "--json")
    assert out.returncode == 0, f"tide {' '.join(args)}: {out.stderr}"
    assert "Traceback" not in out.stderr
    return json.loads(out.stdout)


def test_lookups_by_offset_id_and_key_survive_a_failover(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(name="lookups")
    ctl = cluster.controllers
    sent: list[tuple[bytes, str, Receipt]] = []
    with Client(ctl, send_timeout=20.0) as client:
        client.admin().create_topic(TOPIC, queues=3)
        producer = client.producer()
        for i in range(90):
            key = KEYS[i % len(KEYS)]
            body = b"msg-%d" % i if i % 10 else b"\xff\x00binary-%d" % i
            sent.append((body, key, producer.send(TOPIC, body, key=key)))
        producer.send(TOPIC, b"keyless")

        # by queue position and by id: exactly what was written; the broker set's replicas are
        # asked of the controller once, not once per lookup
        describe = client.aio.controller.describe_broker_sets
        asked: list[Any] = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            asked.append(args)
            return describe(*args, **kwargs)

        client.aio.controller.describe_broker_sets = counted  # type: ignore[method-assign]
        for body, key, r in sent:
            m = eventually(lambda r=r: client.get_message(TOPIC, r.queue, r.queue_offset))
            assert (m.body, m.key, m.offset, m.phys_offset) == (body, key, r.queue_offset, r.phys_offset)
            by_id = client.get_message_by_id(r.message_id)
            assert (by_id.body, by_id.key, by_id.queue, by_id.offset) == (body, key, r.queue, r.queue_offset)
        assert len(asked) == 1, asked
        client.aio.controller.describe_broker_sets = describe  # type: ignore[method-assign]
        # by key: every message of the key, newest first, and nothing else
        for key in KEYS:
            got = eventually(lambda key=key: client.find_messages(TOPIC, key, max_messages=100))
            assert [m.body for m in got] == newest_first(sent, key)
            assert {m.key for m in got} == {key}
        assert [m.body for m in client.find_messages(TOPIC, KEYS[0], max_messages=2)] == newest_first(
            sent, KEYS[0]
        )[:2]
        assert client.find_messages(TOPIC, "no-such-key") == []
        first_ts = client.get_message_by_id(sent[0][2].message_id).store_ts
        assert [m.body for m in client.find_messages(TOPIC, KEYS[0], end_ts=first_ts)] == [sent[0][0]]

        _bad_lookups_get_typed_errors(client, sent)
        _the_command_line_finds_them(ctl, sent)

        name, _ = master_process(cluster, client)
        assert tide("fault", "kill", name, "--data-dir", str(cluster.data_dir)).returncode == 0

    with Client(ctl, send_timeout=20.0) as client:
        for key in KEYS:
            got = eventually(
                lambda key=key: client.find_messages(TOPIC, key, max_messages=100),
                timeout=30,
                what="a key lookup after the failover",
            )
            assert [m.body for m in got] == newest_first(sent, key)
        # (the surviving replica may have answered before it was elected: wait for the election)
        new_name, new_address = eventually(
            lambda: master_process(cluster, client), timeout=30, what="a new master"
        )
        assert new_name != name
        # the new master itself answers, with every acknowledged message of a key
        reply = client.runner.run(
            client.aio.call_broker(
                new_address,
                "FindMessages",
                bpb.FindMessagesRequest(topic=TOPIC, key=KEYS[1], max_messages=100),
            )
        )
        assert reply.count == len(newest_first(sent, KEYS[1]))
        for body, _, r in sent[::7]:
            assert client.get_message_by_id(r.message_id).body == body
        # replicas remembered that no longer serve the set (it moved: here, an address where
        # nothing listens) are asked again of the controller, and the lookup still succeeds
        stale = client.aio._set_addresses[sent[0][2].broker_set]
        client.aio._set_addresses[sent[0][2].broker_set] = (stale[0], ["127.0.0.1:1"])
        assert client.get_message_by_id(sent[0][2].message_id).body == sent[0][0]
        assert client.aio._set_addresses[sent[0][2].broker_set][1] != ["127.0.0.1:1"]


def _bad_lookups_get_typed_errors(client: Client, sent: list[tuple[bytes, str, Receipt]]) -> None:
    r = sent[0][2]
    broker_set = r.broker_set
    forged = [
        f"{broker_set}:{r.phys_offset + 1:x}",  # inside a record
        f"{broker_set}:{1 << 40:x}",  # beyond the log
    ]
    for message_id in forged:
        with pytest.raises(MessageNotFoundError):
            client.get_message_by_id(message_id)
    with pytest.raises(MessageNotFoundError):
        client.get_message_by_id(f"no-such-set:{r.phys_offset:x}")
    for malformed in ("", "nonsense", f"{broker_set}:xyz", f"{broker_set}:-5"):
        with pytest.raises(InvalidArgumentError):
            client.get_message_by_id(malformed)
    # a well-formed id sent to a broker of another set is refused by the broker itself
    address = client.runner.run(client.aio.route(TOPIC)).broker_sets[0].read_addresses()[0]
    with pytest.raises(InvalidArgumentError):
        client.runner.run(
            client.aio.call_broker(
                address, "GetMessageById", bpb.GetMessageByIdRequest(message_id="other:10")
            )
        )
    with pytest.raises(TopicNotFoundError):
        client.get_message("no-such-topic", 0, 0)
    with pytest.raises(TopicNotFoundError):
        client.find_messages("no-such-topic", "k")
    with pytest.raises(InvalidArgumentError):
        client.get_message(TOPIC, 3, 0)  # queues 0..2
    with pytest.raises(InvalidArgumentError):
        client.runner.run(
            client.aio.call_broker(
                address, "GetMessage", bpb.GetMessageRequest(topic=TOPIC, queue=99, offset=0)
            )
        )
    with pytest.raises(MessageNotFoundError):
        client.get_message(TOPIC, r.queue, 10_000)  # past the queue's end
    with pytest.raises(InvalidArgumentError):
        client.find_messages(TOPIC, "")
    with pytest.raises(InvalidArgumentError):
        client.runner.run(
            client.aio.call_broker(address, "FindMessages", bpb.FindMessagesRequest(topic=TOPIC, key=""))
        )
    with pytest.raises(InvalidArgumentError):
        client.runner.run(
            client.aio.call_broker(
                address, "FindMessages", bpb.FindMessagesRequest(topic=TOPIC, key="k", begin_ts=10, end_ts=5)
            )
        )


def _the_command_line_finds_them(ctl: str, sent: list[tuple[bytes, str, Receipt]]) -> None:
    body, key, r = sent[0]  # a binary body: printed as base64
    doc = ok_json("message", "get", "--id", r.message_id, "--controllers", ctl)
    assert doc["body_encoding"] == "base64" and base64.b64decode(doc["body"]) == body
    assert (doc["key"], doc["queue"], doc["offset"], doc["message_id"]) == (
        key,
        r.queue,
        r.queue_offset,
        r.message_id,
    )
    body, key, r = sent[1]
    doc = ok_json(
        "message",
        "get",
        "--topic",
        TOPIC,
        "--queue",
        str(r.queue),
        "--offset",
        str(r.queue_offset),
        "--controllers",
        ctl,
    )
    assert (doc["body"], doc["body_encoding"], doc["key"]) == (body.decode(), "utf-8", key)
    docs = ok_json("message", "find", "--topic", TOPIC, "--key", KEYS[3], "--max", "3", "--controllers", ctl)
    assert [d["body"] for d in docs] == [b.decode() for b in newest_first(sent, KEYS[3])[:3]]
    text = tide("message", "find", "--topic", TOPIC, "--key", KEYS[3], "--controllers", ctl)
    assert text.returncode == 0 and "msg-" in text.stdout
    bad = tide("message", "get", "--id", "broker-a:zz", "--controllers", ctl)
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "Traceback" not in bad.stderr
    missing = tide("message", "get", "--id", f"{r.broker_set}:{r.phys_offset + 1:x}", "--controllers", ctl)
    assert missing.returncode == 1 and "MESSAGE_NOT_FOUND" in missing.stderr
    usage = tide("message", "get", "--topic", TOPIC, "--controllers", ctl)
    assert usage.returncode == 2
