"""The cluster the official RocketMQ clients' tests run on: deploy/local.yaml with two broker sets
(broker-a, broker-b) of two replicas each, so that every topic's queues lie in two sets and a
master can be killed; and the helpers those tests share to look at it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.client.conftest import LocalCluster, local_cluster_with, tide
from tidelog import localcluster
from tidelog.client import modes
from tidelog.client.aio import AsyncClient, ConsumedMessage
from tidelog.errors import TopicNotFoundError
from tidelog.localcluster import wait_until

SETS = ("broker-a", "broker-b")
#: Queues of a topic in each broker set: 8 in all.
QUEUES_PER_SET = 4


@contextlib.contextmanager
def two_sets(where: Path, tls: bool = False, **broker: Any) -> Iterator[LocalCluster]:
    """deploy/local.yaml with two broker sets of two replicas and `broker`'s keys for every broker
    (with `tls`, TLS on every port), started under `where` and stopped (every process) on leaving."""
    with local_cluster_with(where, broker_sets=SETS, tls=tls, **broker) as c:
        yield c


def members(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every broker as `tide cluster status --json` names it, with its broker set (`set`) and
    process name (`name`)."""
    env = {"TIDE_CONTROLLERS": cluster.controllers}
    if cluster.up_doc.get("ca_file"):  # a cluster with TLS
        env["TIDE_CA_FILE"] = str(cluster.up_doc["ca_file"])
    out = tide("cluster", "status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    names = {p.get("address"): p["name"] for p in cluster.state()["processes"]}
    return [
        {**m, "set": s["name"], "name": names.get(m["address"], "")}
        for s in json.loads(out.stdout)["broker_sets"]
        for m in s["members"]
    ]


def member(cluster: LocalCluster, broker_set: str, role: str, timeout: float = 20.0) -> dict[str, Any]:
    """The member of `broker_set` in `role` ("master" or "slave"), once one is: right after
    `cluster up` a slave may not have taken its role yet (it follows at its next heartbeat)."""

    def found() -> list[dict[str, Any]]:
        return [m for m in members(cluster) if m["set"] == broker_set and m["role"] == role]

    wait_until(
        lambda: len(found()) == 1 and found()[0]["rocketmq_endpoint"],
        timeout,
        0.2,
        what=f"a {role} of {broker_set} with a RocketMQ endpoint",
    )
    return found()[0]


def endpoint(cluster: LocalCluster, broker_set: str = "broker-a", role: str = "master") -> str:
    """The RocketMQ endpoint of `broker_set`'s member in `role`: any one serves every topic."""
    return str(member(cluster, broker_set, role)["rocketmq_endpoint"])


def create_topic(cluster: LocalCluster, name: str, queues: int = QUEUES_PER_SET) -> dict[str, int]:
    """Topic `name` with `queues` queues in every broker set of the cluster."""

    async def go() -> dict[str, int]:
        async with AsyncClient(cluster.controllers, ca_file=cluster.up_doc.get("ca_file")) as client:
            return await client.admin().create_topic(name, queues=queues)

    return asyncio.run(go())


def create_topic_in(cluster: LocalCluster, name: str, broker_set: str, queues: int) -> dict[str, int]:
    """Topic `name` with `queues` queues in `broker_set` only."""

    async def go() -> dict[str, int]:
        async with AsyncClient(cluster.controllers) as client:
            return await client.admin().create_topic(name, queues=queues, broker_sets=[broker_set])

    return asyncio.run(go())


def master_of(cluster: LocalCluster, broker_set: str = "broker-a") -> str:
    """The name of the process that is `broker_set`'s master now, or "" while it has none."""
    found = [m["name"] for m in members(cluster) if m["set"] == broker_set and m["role"] == "master"]
    return found[0] if found else ""


@contextlib.contextmanager
def driver_run(command: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """A client driver process, killed on the way out if it is still running."""
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield driver
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()


def driver_output(driver: subprocess.Popen[str]) -> dict[str, Any]:
    """The driver's last line (JSON), once it ends by itself with exit status 0."""
    stdout, stderr = driver.communicate(timeout=150)
    assert driver.returncode == 0, stderr[-3000:]
    out: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return out


def receipts_so_far(progress: Path) -> int:
    """How many sends the driver has had receipted (its progress file; 0 before the first)."""
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0  # not written yet, or read while being written


def receipts_now(progress: Path) -> int:
    """The count of receipts as a baseline, once sends flow (`wait_for_flow`): a read that meets
    the driver rewriting its file finds it empty, and a baseline of 0 would count every receipt so
    far as one after it; so read until the count shows."""
    return int(wait_until(lambda: receipts_so_far(progress), 5, 0.01, what="the driver's progress"))


def wait_for_flow(driver: subprocess.Popen[str], ready: Path, progress: Path, timeout: float) -> None:
    """Until the driver has touched `ready` and had 20 sends receipted (its progress file); it must
    still run then."""
    wait_until(
        lambda: (ready.exists() and receipts_so_far(progress) >= 20) or driver.poll() is not None,
        timeout,
        0.1,
        what="messages flowing",
    )
    assert driver.poll() is None, driver.communicate()[1][-3000:]


def kill_master_under(
    cluster: LocalCluster,
    victim: str,
    command: list[str],
    where: Path,
    after_kill: int = 20,
    **popen: Any,
) -> tuple[dict[str, Any], float]:
    """Run a client driver (`command`, which touches where/ready once it sends and receives, writes
    its count of receipts to where/progress, and stops sending once where/stop exists), kill -9
    the master `victim` under it once 20 sends were receipted, start it again once another master
    serves, stop the driver once `after_kill` more sends were receipted, and return its last line
    (JSON) once it ends, with the time of the kill (ms since the epoch, as receipts' `epochMs`)."""
    ready, progress = where / "ready", where / "progress"
    with driver_run(command, **popen) as driver:
        wait_for_flow(driver, ready, progress, 30)
        localcluster.kill(cluster.data_dir, victim, signal.SIGKILL)
        killed_ms = time.time() * 1000
        at_kill = receipts_now(progress)
        wait_until(lambda: master_of(cluster) not in ("", victim), 30, 0.2, what="a new master")
        localcluster.restart(cluster.data_dir, victim)
        wait_until(
            lambda: driver.poll() is not None or receipts_so_far(progress) >= at_kill + after_kill,
            60,
            0.1,
            what=f"{after_kill} sends receipted after the kill",
        )
        (where / "stop").touch()
        return driver_output(driver), killed_ms


def dead_letters(cluster: LocalCluster, group: str, expected: int) -> list[ConsumedMessage]:
    """What `%DLQ%<group>` holds in either broker set once it holds `expected` (or after 20 s)."""

    async def go() -> list[ConsumedMessage]:
        async with AsyncClient(cluster.controllers) as client:
            deadline = time.monotonic() + 20
            got: list[ConsumedMessage] = []
            while time.monotonic() < deadline:
                got = []
                for broker_set in SETS:  # the dead-letter topic has a queue in each set
                    with contextlib.suppress(TopicNotFoundError):
                        reader = client.reader(modes.dlq_topic(group), 0, broker_set=broker_set)
                        got += await reader.read(max_messages=1000, timeout=1)
                if len(got) >= expected:
                    break
                await asyncio.sleep(0.5)
            return got

    return asyncio.run(go())
