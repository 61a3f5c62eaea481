"""A topic's own retention end to end (docs/ARCHITECTURE.md §6.4): a `tide cluster up` cluster
with 64 KiB segments and a broker retention far longer than the test; `tide topic alter short
--retention 3s` makes the min offset of `short` move forward in `tide topic describe` and an old
read get OFFSET_BELOW_RETENTION, while `long` (its own 7d) keeps every message. Bad input gets
one clear line."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster, tide
from tests.client.test_bad_input import one_clear_line
from tests.client.test_cli import ok_json
from tidelog.client import Client, OutMessage
from tidelog.errors import OffsetBelowRetentionError

pytestmark = pytest.mark.slow

SEG = 64 << 10
BODY = b"r" * 1000


def _topology(tmp_path: Path) -> Path:
    doc = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    doc["broker"].update(segment_bytes=SEG, retention_ms=600_000, retention_check_interval_ms=300)
    path = tmp_path / "topic-retention.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _send(client: Client, topic: str, count: int) -> None:
    client.producer().send_batch(topic, [OutMessage(BODY) for _ in range(count)])


def _describe(controllers: str, topic: str) -> dict[str, Any]:
    (row,) = ok_json("topic", "describe", topic, "--controllers", controllers)
    return dict(row)


def test_a_topic_retention_moves_its_min_offset_and_leaves_other_topics_alone(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(topology=_topology(tmp_path), name="topicret")
    c = cluster.controllers
    created = ok_json("topic", "create", "short", "--queues", "1", "--controllers", c)
    assert (created["retention_ms"], created["retention"]) == (0, "broker")
    ok_json("topic", "create", "long", "--queues", "1", "--retention", "7d", "--controllers", c)
    with Client(c) as client:
        for _ in range(3):  # both topics in the same first segments
            _send(client, "short", 50)
            _send(client, "long", 50)
        altered = ok_json("topic", "alter", "short", "--retention", "3s", "--controllers", c)
        assert altered == {"topic": "short", "retention_ms": 3000, "retention": "3s"}
        deadline = time.monotonic() + 40
        # polled in-process (a `tide` process a poll cost about a second of CPU); the command's own
        # view of the moved offset is checked once it has moved, below
        while client.admin().describe_topic("short")[0]["min"] == 0:
            assert time.monotonic() < deadline, "the topic's retention did not move its min offset"
            _send(client, "long", 20)  # later writes close the segments holding short's records
            time.sleep(0.5)
        short = _describe(c, "short")
        assert short["min"] > 0 and (short["retention_ms"], short["retention"]) == (3000, "3s")
        with pytest.raises(OffsetBelowRetentionError):
            client.reader("short", 0, 0).read()
        long = _describe(c, "long")
        assert long["min"] == 0 and long["max"] >= 150 and long["retention"] == "7d"
        first = client.reader("long", 0, 0).read(max_messages=5)
        assert [m.offset for m in first] == [0, 1, 2, 3, 4] and first[0].body == BODY
        # new messages are readable again, past its new start: read at once, from where they were
        # stored (a `tide topic describe` first takes seconds on a loaded machine, time enough for
        # the 3 s retention to take these too once a segment closes over them), waiting for them
        # to be confirmed: an acknowledgement may come before the slave's copy makes them readable
        receipts = client.producer().send_batch("short", [OutMessage(b"again-%d" % i) for i in range(5)])
        assert receipts[0].queue_offset >= short["min"]
        reader = client.reader("short", 0, receipts[0].queue_offset)
        again: list[bytes] = []
        until = time.monotonic() + 20
        while len(again) < 5:
            assert time.monotonic() < until, f"read back only {again}"
            again += [m.body for m in reader.read(max_messages=5 - len(again), timeout=1.0)]
        assert again == [b"again-%d" % i for i in range(5)]
    table = tide("topic", "list", "--controllers", c)
    assert table.returncode == 0 and "3s" in table.stdout and "7d" in table.stdout
    back = ok_json("topic", "alter", "short", "--retention", "default", "--controllers", c)
    assert back["retention_ms"] == 0
    one_clear_line(tide("topic", "alter", "nosuch", "--retention", "1h", "--controllers", c), "nosuch")
    one_clear_line(
        tide("topic", "alter", "short", "--retention", "500ms", "--controllers", c), "retention_ms"
    )
