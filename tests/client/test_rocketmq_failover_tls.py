"""The official RocketMQ clients (unmodified) failing over across endpoints under TLS: when the
RocketMQ endpoint a client is connected to is killed (kill -9), it goes on sending and receiving
through another, losing no acknowledged message. Both trust the cluster's CA through
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (what gRPC trusts by default, in C-core and in grpc-js), and both
are given one DNS name with two address records, which the two endpoints' certificates name
(tests/client/rocketmq_failover.py).

Under TLS the name is the only way for either. The Node.js client 1.0.8 cannot take several
addresses at all. The Python client 5.1.2 takes `a;b` but makes one gRPC target of it,
`ipv4:a,b`, whose authority (the name a certificate is checked against) is the whole list
"a,b": every connection then fails hostname verification ("Hostname Verification Check failed"),
whatever the certificates name, and the client never starts. Its channel options are fixed
(no `grpc.ssl_target_name_override`). Without TLS, `a;b` fails over (test_rocketmq_push.py)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client import rocketmq_failover as rf
from tests.client import test_rocketmq_node_failover as node
from tests.client.conftest import LocalCluster, runs_from
from tests.client.test_rocketmq_endpoint import DRIVER
from tests.client.test_rocketmq_node import INSTALLED
from tidelog import localcluster
from tidelog.localcluster import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rf.hosts_file(tmp_path_factory.mktemp("hosts"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, hosts: Path) -> Iterator[tuple[LocalCluster, int]]:
    """Two broker sets with TLS on every port, whose slaves serve RocketMQ behind rf.NAME (their
    certificates naming it), at the port returned."""
    with rc.two_sets(
        tmp_path_factory.mktemp("rmqtlsfail"), tls=True, rocketmq_invisible_ms=rf.INVISIBLE_MS
    ) as c:
        yield c, rf.move_slaves(c)


@pytest.fixture
def endpoints(tls_cluster: tuple[LocalCluster, int]) -> Iterator[tuple[LocalCluster, int]]:
    """The TLS cluster with both endpoints behind rf.NAME serving: the one a test killed is
    started again after it."""
    yield tls_cluster
    c, port = tls_cluster
    pids = c.pids()
    for broker_set in rf.ADDRESSES:
        name = next(m["name"] for m in rc.members(c) if m["set"] == broker_set and m["role"] != "master")
        if not runs_from(pids[name], c.data_dir):
            localcluster.restart(c.data_dir, name)
    wanted = {f"{a}:{port}" for a in rf.ADDRESSES.values()}
    wait_until(
        lambda: wanted <= {m["rocketmq_endpoint"] for m in rc.members(c) if m["role"] == "slave"},
        30,
        0.2,
        what=f"both endpoints {sorted(wanted)} back",
    )


@pytest.mark.skipif(
    shutil.which("node") is None or not INSTALLED,
    reason="needs node and `npm ci` in tests/client/node (make test does both)",
)
def test_the_node_client_fails_over_across_a_names_endpoints_over_tls(
    endpoints: tuple[LocalCluster, int], hosts: Path, tmp_path: Path
) -> None:
    c, port = endpoints
    node.fails_over(c, port, hosts, tmp_path, "node-tls-failover", tls=True)


def test_the_python_client_fails_over_across_a_names_endpoints_over_tls(
    endpoints: tuple[LocalCluster, int], hosts: Path, tmp_path: Path
) -> None:
    """Given one name (not `a;b`, whose one target no certificate can name: module docstring)."""
    c, port = endpoints
    rc.create_topic(c, "py-tls-failover")
    env = {**os.environ, "DRIVER_TLS": "1", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(c.up_doc["ca_file"])}
    files = [str(tmp_path / f) for f in ("ready", "stop", "progress")]
    args = ["py-tls-failover", "g-py-tls-failover", "120", *files]  # 120 s: a bound, the stop file ends it
    command = [sys.executable, str(DRIVER), f"{rf.NAME}:{port}", "produce-consume", *args]
    rf.fails_over(c, port, rf.in_own_hosts(hosts, command), tmp_path, "the Python client over TLS", env=env)
