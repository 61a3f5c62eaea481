"""Scenario: a topic spread over two broker sets. Routing, groups and readers work on
(broker set, queue) pairs, not on queue numbers alone.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator

import pytest

from tests.client.conftest import LocalCluster, start_cluster, stop_cluster, tide
from tidelog.client import Client, OutMessage, Receipt
from tidelog.errors import InvalidArgumentError

pytestmark = pytest.mark.slow

TWO_SETS = """
host: 127.0.0.1
ports: auto
controller: {nodes: 1, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 2500}
broker_sets: [{name: broker-a, replicas: 1}, {name: broker-b, replicas: 1}]
broker: {flush: async, replication: async, heartbeat_interval_ms: 500}
"""

Where = tuple[str, int, int]  # (broker set, queue, queue offset)


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("two-sets")
    topology = root / "two-sets.yaml"
    topology.write_text(TWO_SETS)
    c = start_cluster(root / "data", topology)
    try:
        yield c
    finally:
        stop_cluster(c)


def where(r: Receipt) -> Where:
    return r.broker_set, r.queue, r.queue_offset


def test_keys_and_groups_span_both_sets(two_sets: LocalCluster) -> None:
    with Client(two_sets.controllers) as client:
        assert client.admin().create_topic("wide", queues=3) == {"broker-a": 3, "broker-b": 3}
        producer = client.producer()
        pairs = {(s, q) for s in ("broker-a", "broker-b") for q in range(3)}
        sent: dict[Where, bytes] = {}
        per_key: dict[str, list[Where]] = collections.defaultdict(list)
        for i in range(300):
            key = f"user-{i % 30}"
            r = (
                producer.send("wide", f"{key} #{i}".encode(), key=key)
                if i % 2
                else producer.send_batch("wide", [OutMessage(f"{key} #{i}".encode(), key)])[0]
            )
            sent[where(r)] = f"{key} #{i}".encode()
            per_key[key].append(where(r))
        assert {(s, q) for s, q, _ in sent} == pairs, "the keys did not reach every (broker set, queue)"
        for key, places in per_key.items():
            assert len({(s, q) for s, q, _ in places}) == 1, f"key {key} spread over queues"
            assert [o for _, _, o in places] == sorted(o for _, _, o in places)
        # Keyless messages go round robin over both sets.
        keyless = {r.broker_set for r in (producer.send("wide", b"no key") for _ in range(12))}
        assert keyless == {"broker-a", "broker-b"}

        members = [client.consumer(group="wide", topic="wide", heartbeat_interval=0.3) for _ in range(2)]
        try:
            seen: dict[Where, bytes] = {}
            deadline = time.monotonic() + 60
            while not (set(sent) <= set(seen) and sum(len(m.assignment) for m in members) == 6):
                assert time.monotonic() < deadline, f"consumed {len(set(sent) & set(seen))} of {len(sent)}"
                for m in members:
                    for msg in m.poll(max_messages=100, timeout=0.2):
                        seen[(msg.broker_set, msg.queue, msg.offset)] = msg.body
            owned = [set(m.assignment) for m in members]
            assert owned[0] | owned[1] == pairs and not owned[0] & owned[1]
            assert all(seen[w] == body for w, body in sent.items())
        finally:
            for m in members:
                m.close()

        # A reader needs the broker set once the topic spans two.
        with pytest.raises(InvalidArgumentError):
            client.reader("wide", 0, 0).read(max_messages=1)
        for s, q in sorted(pairs):
            expected = sorted((o, b) for (ss, qq, o), b in sent.items() if (ss, qq) == (s, q))
            reader = client.reader("wide", q, expected[0][0], broker_set=s)
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 10
            while len(got) < len(expected) and time.monotonic() < deadline:
                got += [
                    (m.offset, m.body)
                    for m in reader.read(max_messages=500, timeout=0.3)
                    if (s, q, m.offset) in sent
                ]
            assert got == expected, (s, q)

    status = tide("cluster", "status", "--controllers", two_sets.controllers, "--json")
    assert status.returncode == 0, status.stderr
    sets = {b["name"]: b for b in json.loads(status.stdout)["broker_sets"]}
    assert set(sets) == {"broker-a", "broker-b"}
    for b in sets.values():
        (member,) = b["members"]
        assert b["master"] == member["broker_id"] and member["max_offset"] > 0
