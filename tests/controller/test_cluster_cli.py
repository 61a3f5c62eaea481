"""Scenario: an operator drives a running controller with `tide admin` (tables and --json)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests import procs
from tests.procs import ControllerCluster
from tidelog.client import assign as asg
from tidelog.client.controllers import ControllerClient
from tidelog.errors import UnavailableError

pytestmark = pytest.mark.slow


def tide(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return procs.tide(*args, timeout=60, env={**os.environ, **(env or {})})


def tide_json(*args: str) -> Any:
    out = tide(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_admin_commands(controller_cluster: Callable[..., ControllerCluster]) -> None:
    # The brokers heartbeat once, at registration: they count as alive for the heartbeat timeout,
    # which must outlast every `tide` call below on a loaded machine (each is a process of its
    # own; a run on four workers took 38 s and saw them expire before the `clean` check).
    cluster = controller_cluster(1, heartbeat_interval_ms=1000, heartbeat_timeout_ms=180_000)
    ctl = ["admin", "--controllers", cluster.address_list]

    async def register() -> None:
        async with ControllerClient(cluster.address_list) as c:
            for i in (1, 2):
                r = await c.register_broker(
                    "broker-a", f"127.0.0.1:{30000 + i}", f"127.0.0.1:{31000 + i}", identity=f"a-{i}"
                )
                await c.heartbeat("broker-a", r.broker_id, epoch=0, max_offset=0)

    asyncio.run(register())

    status = tide_json(*ctl, "status")
    assert status[0]["raft_state"] == "leader" and status[0]["ready"] is True

    elected = tide_json(*ctl, "elect", "broker-a", "--broker-id", "1")
    assert elected["role"]["master_id"] == 1 and elected["role"]["master_epoch"] == 1

    sets = tide_json(*ctl, "broker-sets")
    assert sets["liveness_known"] is True
    (bs,) = sets["broker_sets"]
    assert bs["role"]["sync_state_set"] == [1]
    assert [(m["broker_id"], m["is_master"], m["alive"]) for m in bs["members"]] == [
        (1, True, True),
        (2, False, True),
    ]
    table = tide(*ctl, "broker-sets")
    assert table.returncode == 0 and "broker-a" in table.stdout

    created = tide_json(*ctl, "topics", "create", "orders", "--queues", "broker-a=4")
    assert created == {
        "name": "orders",
        "perm": "rw",
        "queues": {"broker-a": 4},
        "generation": 1,
        "retention_ms": 0,  # the brokers' own retention
    }
    # $TIDE_CONTROLLERS is the default address list
    listed = tide("admin", "topics", "list", "--json", env={"TIDE_CONTROLLERS": cluster.address_list})
    assert listed.returncode == 0 and [t["name"] for t in json.loads(listed.stdout)] == ["orders"]
    table = tide(*ctl, "topics", "list")
    assert "orders" in table.stdout and "broker-a=4" in table.stdout

    assert tide("topic", "delete", "orders", "--controllers", cluster.address_list).returncode == 0
    again = tide("topic", "delete", "orders", "--controllers", cluster.address_list)
    assert again.returncode == 1 and "TOPIC_NOT_FOUND" in again.stderr
    bad = tide(*ctl, "topics", "create", "x", "--queues", "broker-a")
    assert bad.returncode != 0 and "BROKER_SET=COUNT" in bad.stderr
    # designated election of a broker outside the SyncStateSet is refused with a typed error
    refused = tide(*ctl, "elect", "broker-a", "--broker-id", "2")
    assert refused.returncode == 1 and "CONTROLLER_ELECT_MASTER_FAILED" in refused.stderr

    # a living broker is not forgotten by accident; a decommissioned one can be
    living = tide(*ctl, "clean", "broker-a", "--broker-id", "2")
    assert living.returncode == 1 and "CONTROLLER_INVALID_CLEAN_BROKER_METADATA" in living.stderr
    assert tide(*ctl, "clean", "broker-a", "--broker-id", "2", "--clean-living").returncode == 0
    (bs,) = tide_json(*ctl, "broker-sets")["broker_sets"]
    assert [m["broker_id"] for m in bs["members"]] == [1]


async def _status_once_serving(c: ControllerClient, address: str) -> Any:
    """One node's status, waiting (20 s at most) for a node still starting to serve: the cluster
    answers once a leader is elected, which does not need every node up."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await c.cluster_status(address=address)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_topic_alter_delete_and_broker_list(controller_cluster: Callable[..., ControllerCluster]) -> None:
    """`tide topic alter` grows queues and refuses to shrink them; `tide topic delete` refuses a
    topic a group reads unless --force; `tide broker list` shows every broker with its liveness,
    also when the address given is a follower's."""
    # heartbeats only at registration: the timeout outlasts the test's `tide` calls (see above)
    cluster = controller_cluster(3, heartbeat_interval_ms=1000, heartbeat_timeout_ms=180_000)
    ctl = ["--controllers", cluster.address_list]

    async def setup() -> str:
        async with ControllerClient(cluster.address_list) as c:
            for i in (1, 2):
                r = await c.register_broker(
                    "broker-a", f"127.0.0.1:{30000 + i}", f"127.0.0.1:{31000 + i}", identity=f"a-{i}"
                )
                await c.heartbeat("broker-a", r.broker_id, epoch=0, max_offset=0)
            await c.elect_master("broker-a", 1)
            await c.create_topic("orders", {"broker-a": 2})
            # a consumer group member that polled "orders" just now
            await c.meta_create(
                asg.members_prefix("g1") + "m1", asg.announcement(int(time.time() * 1000), "orders")
            )
            statuses = [await _status_once_serving(c, a) for a in c.addresses]
            return next(a for a, st in zip(c.addresses, statuses, strict=True) if st.raft_state != "leader")

    follower = asyncio.run(setup())

    grown = tide_json("topic", "alter", "orders", "--queues", "4", *ctl)
    assert grown == {"topic": "orders", "queues": {"broker-a": 4}}
    shrink = tide("topic", "alter", "orders", "--queues", "3", *ctl)
    assert shrink.returncode == 1 and "TOPIC_QUEUES_SHRINK" in shrink.stderr and "only go up" in shrink.stderr
    assert "Traceback" not in shrink.stderr

    brokers = tide_json("broker", "list", "--controllers", follower)
    assert [(b["broker_set"], b["id"], b["role"], b["alive"]) for b in brokers] == [
        ("broker-a", 1, "master", True),
        ("broker-a", 2, "slave (catching up)", True),
    ]
    table = tide("admin", "--controllers", follower, "broker-sets")
    assert table.returncode == 0 and "liveness unknown" not in table.stdout and " up" in table.stdout

    in_use = tide("topic", "delete", "orders", *ctl)
    assert in_use.returncode == 1 and "TOPIC_IN_USE" in in_use.stderr and "g1" in in_use.stderr
    assert tide_json("topic", "list", *ctl)[0]["name"] == "orders", "a refused delete deletes nothing"
    forced = tide_json("topic", "delete", "orders", "--force", *ctl)
    assert forced == {"topic": "orders", "deleted": True, "forced": True, "readers": ["g1"]}
    assert tide_json("topic", "list", *ctl) == []
