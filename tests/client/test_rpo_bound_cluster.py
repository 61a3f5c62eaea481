"""controller/RULES.md L10 over real processes: with `rpo_bound_bytes`, a master alone in its
SyncStateSet acknowledges at most that far past the last report every controller's log holds.
Three controllers and a broker set of one replica (alone for good); one controller follower is
paused (SIGSTOP), so its log stops taking the master's reports: the master acknowledges no more
than the bound past where it stood, then answers RPO_BOUND_REACHED; once the follower resumes, it
acknowledges again. Without the rule, every send succeeds while the follower is paused."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.client.conftest import LocalCluster
from tidelog.client import Client
from tidelog.client.controllers import ControllerClient
from tidelog.errors import RpoBoundReachedError, TidelogError

pytestmark = pytest.mark.slow

BOUND = 40_000
BODY = b"b" * 1000


def _topology(tmp_path: Path) -> Path:
    doc = {
        "host": "127.0.0.1",
        "ports": "auto",
        "controller": {
            "nodes": 3,
            "heartbeat_interval_ms": 300,
            "heartbeat_timeout_ms": 1500,
            "rpo_bound_bytes": BOUND,
        },
        "broker_sets": [{"name": "broker-a", "replicas": 1}],
        "broker": {
            "flush": "async",
            "replication": "sync",
            "in_sync_replicas": 1,
            "heartbeat_interval_ms": 300,
            "slave_timeout_ms": 1500,
        },
    }
    path = tmp_path / "rpo-bound.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _a_follower(cluster: LocalCluster) -> int:
    """The pid of a controller that does not lead."""
    controllers = [p for p in cluster.state()["processes"] if p["kind"] == "controller"]

    async def leader() -> str:
        async with ControllerClient(cluster.controllers) as c:
            return (await c.cluster_status()).leader_id

    lead = asyncio.run(leader())
    return next(p["pid"] for p in controllers if not p["name"].endswith(f"-{lead}"))


def test_a_master_alone_acknowledges_at_most_the_bound_past_what_every_controller_holds(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(topology=_topology(tmp_path), name="rpobound")
    with Client(cluster.controllers) as client:
        producer = client.producer()
        client.admin().create_topic("t", queues=1)
        last = None
        for _ in range(100):  # well past the bound: grants keep coming while every controller is up
            last = producer.send("t", BODY)
        assert last is not None
        end_at_pause = last.phys_offset + 2 * len(BODY)  # the record's end, header included
        follower = _a_follower(cluster)
        os.kill(follower, signal.SIGSTOP)
        try:
            acked_after: list[int] = []
            refused = None
            for _ in range(3 * BOUND // len(BODY)):
                try:
                    acked_after.append(producer.send("t", BODY).phys_offset)
                except RpoBoundReachedError as exc:
                    refused = exc
                    break
            assert refused is not None, f"{len(acked_after)} sends acknowledged with a controller paused"
            assert "RPO_BOUND_REACHED" in str(refused.code)
            # nothing acknowledged ends past the bound beyond where the master stood at the pause
            assert all(p + len(BODY) <= end_at_pause + BOUND for p in acked_after), (
                end_at_pause,
                acked_after,
            )
        finally:
            os.kill(follower, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while True:  # the follower takes the reports again: grants resume
            try:
                producer.send("t", BODY)
                break
            except TidelogError:
                assert time.monotonic() < deadline, "no send acknowledged after the controller resumed"
