"""The official RocketMQ Node.js client (rocketmq-client-nodejs, unmodified) given one DNS name that
resolves to several brokers' RocketMQ endpoints: when the endpoint it is connected to dies, it
goes on sending and receiving through another, losing no acknowledged message.

This client cannot take several addresses (it joins `a;b` into one gRPC target that grpc-js cannot
resolve), so a name with several records is how it gets failover: grpc-js resolves the name to
every address (`dns.lookup(name, {all: true})`, the system's resolver), connects to the first that
answers (pick_first) and, once that connection drops, to the next. The routes name the same name,
since the endpoint answers QueryRoute with the access point the client asked through.

Several records for one name without a DNS server: tests/client/rocketmq_failover.py (two
slaves moved to 127.0.0.2 and 127.0.0.3, and a hosts file of the client's own)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client import rocketmq_failover as rf
from tests.client.conftest import LocalCluster
from tests.client.test_rocketmq_endpoint import drive
from tests.client.test_rocketmq_node import DRIVER, INSTALLED, NODE_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("node") is None or not INSTALLED,
        reason="needs node and `npm ci` in tests/client/node (make test does both)",
    ),
]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rf.hosts_file(tmp_path_factory.mktemp("hosts"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, hosts: Path) -> Iterator[tuple[LocalCluster, int]]:
    """Two broker sets whose slaves serve RocketMQ behind rf.NAME, at the port returned."""
    with rc.two_sets(tmp_path_factory.mktemp("rmqnodefail"), rocketmq_invisible_ms=rf.INVISIBLE_MS) as c:
        yield c, rf.move_slaves(c)


def fails_over(c: LocalCluster, port: int, hosts: Path, where: Path, topic: str, tls: bool = False) -> None:
    """The Node client given rf.NAME (with `tls`, over TLS trusting the cluster's CA) sends and
    receives through it; the endpoint it is connected to is killed; it goes on through the other,
    and every message it had receipted is received."""
    rc.create_topic(c, topic)
    env = {**os.environ, "HOME": str(where)}  # the client logs into files under $HOME
    if tls:  # grpc-js trusts this file instead of Node's roots (its createSsl() without roots)
        env.update(DRIVER_TLS="1", GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(c.up_doc["ca_file"]))
    args = {
        "topic": topic,
        "group": f"g-{topic}",
        "seconds": 120,  # a bound: the test ends the run through stopFile once it has what it needs
        "readyFile": str(where / "ready"),
        "stopFile": str(where / "stop"),
        "progressFile": str(where / "progress"),
        "readyDelivered": 20,  # sent and received through the name before the kill
    }
    command = rf.in_own_hosts(
        hosts, ["node", str(DRIVER), f"{rf.NAME}:{port}", "produce-consume", json.dumps(args)]
    )
    label = "the Node client over TLS" if tls else "the Node client"
    rf.fails_over(c, port, command, where, label, cwd=NODE_DIR, env=env)


def test_a_name_of_several_endpoints_fails_over_when_the_connected_one_is_killed(
    cluster: tuple[LocalCluster, int], hosts: Path, tmp_path: Path
) -> None:
    c, port = cluster
    fails_over(c, port, hosts, tmp_path, "node-failover")


def test_a_receive_that_names_no_invisible_duration_gets_the_brokers_setting(
    cluster: tuple[LocalCluster, int],
) -> None:
    """The official clients' push consumers name no invisible duration: the endpoint applies its
    `rocketmq_invisible_ms` (here rf.INVISIBLE_MS), which is what bounds the failover above.

    The topic is in broker-a only: a SimpleConsumer takes a topic's queues in turn, four of one
    set before the next set's, waiting out a long poll on each empty one, so with queues in both
    sets the redelivery could wait out broker-b's four polls as well (a gap of 20 s under load)."""
    c, _ = cluster
    endpoint = rc.endpoint(c, "broker-a", "master")
    rc.create_topic_in(c, "rmq-default-invisible", "broker-a", queues=rc.QUEUES_PER_SET)
    (receipt,) = drive(endpoint, "send", "rmq-default-invisible", "1", "0")["sent"]
    first, second = drive(endpoint, "redeliver", "rmq-default-invisible", "g-default-invisible", "0")[
        "rounds"
    ]
    assert first["id"] == second["id"] == receipt["id"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    gap = second["at"] - first["at"]
    # not before the setting ran out, and long before the 30 s default would
    assert rf.INVISIBLE_MS / 1000 - 0.5 <= gap < 20, gap
