"""Scenario: an operator watches a `tide cluster up` cluster with `tide top` while a producer runs
and a consumer group lags behind: `--json` names every member with its role, the master's
produce rate is positive, the group's lag is there; `--once` draws the same as a table."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, tide
from tidelog.client import Client

pytestmark = pytest.mark.slow

TOPIC = "top-t"


def ok(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    out = tide(*args, timeout=timeout)
    assert out.returncode == 0, f"tide {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
    assert "Traceback" not in out.stderr
    return out


class Producing:
    """A producer sending small messages from a thread until stopped."""

    def __init__(self, controllers: str) -> None:
        self.controllers = controllers
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.controllers) as client:
            producer = client.producer()
            while not self.stop.is_set():
                producer.send(TOPIC, b"m" * 200)
                self.sent += 1

    def __enter__(self) -> Producing:
        self.thread.start()
        deadline = time.monotonic() + 20
        while self.sent < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.sent >= 10, "the producer did not get going"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _check_members(doc: dict[str, Any], cluster: LocalCluster) -> dict[str, Any]:
    assert doc["version"] == 1 and doc["liveness_known"] is True and doc["errors"] == []
    assert doc["rate_window_s"] is not None and doc["rate_window_s"] >= 1.0
    (bs,) = doc["broker_sets"]
    assert bs["name"] == "broker-a" and bs["epoch"] >= 1
    members = {m["broker_id"]: m for m in bs["members"]}
    addresses = {p["address"] for p in cluster.up_doc["processes"] if p["kind"] == "broker"}
    assert {m["address"] for m in members.values()} == addresses
    assert sorted(m["role"] for m in members.values()) == ["master", "slave"]
    assert members[bs["master"]]["role"] == "master"
    assert all(m["alive"] is True and m["epoch"] == bs["epoch"] for m in members.values())
    assert bs["master"] in bs["sync_state_set"]
    for m in members.values():
        assert m["in_sync"] == (m["broker_id"] in bs["sync_state_set"])
        assert isinstance(m["lag_bytes"], int) and m["lag_bytes"] >= 0
        # each member's offsets come from its own Status call, read after the set's: only the
        # member's own pair is one reading
        assert m["confirm_offset"] <= m["max_offset"]
    return bs


def test_top_shows_roles_rates_and_lag_of_a_live_cluster(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    c = cluster_factory(name="top")
    cs = c.controllers
    ok("topic", "create", TOPIC, "--queues", "2", "--controllers", cs)
    ok("produce", TOPIC, "--count", "50", "--controllers", cs)
    ok(
        "consume",
        TOPIC,
        "--group",
        "behind",
        "--from-beginning",
        "--max-messages",
        "20",
        "--idle-timeout",
        "5",
        "--json",
        "--controllers",
        cs,
    )
    with Producing(cs) as producing:
        doc = json.loads(ok("top", "--json", "--controllers", cs).stdout)
        frame = ok("top", "--once", "--interval", "0.5", "--controllers", cs).stdout
    bs = _check_members(doc, c)
    assert bs["produce_bytes_per_s"] > 0, "a producer ran during the window"
    (topic,) = [t for t in doc["topics"] if t["name"] == TOPIC]
    assert topic["produce_messages_per_s"] > 0 and 50 < topic["messages"] <= 50 + producing.sent
    (group,) = [g for g in doc["groups"] if g["group"] == "behind"]
    assert group["topic"] == TOPIC and group["committed"] == 20 and group["lag"] >= 30
    for shown in ("broker-a", "master", "slave", TOPIC, "behind", "B/s", "msg/s"):
        assert shown in frame, f"{shown!r} not in the frame:\n{frame}"
