"""Access keys on the RocketMQ endpoint (`rocketmq_access_keys`, broker/rocketmq.py): the official
RocketMQ Python client, unmodified, sends and receives with a configured key and is refused with
a wrong secret or none; unsigned and stale calls, the Telemetry stream included, answer
UNAUTHORIZED. The client runs in its own process (tests/client/rocketmq_driver.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster, tide
from tests.client.test_rocketmq_endpoint import DRIVER, create_topic

pytestmark = pytest.mark.slow


def drive(*args: str) -> dict[str, Any]:
    # The Python client stamps its local time with a 'Z': its clock is read as UTC here
    env = {**os.environ, "TZ": "UTC"}
    out = subprocess.run(
        [sys.executable, str(DRIVER), *args], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def master_endpoint(cluster: LocalCluster) -> str:
    out = tide("cluster", "status", "--json", env={"TIDE_CONTROLLERS": cluster.controllers})
    assert out.returncode == 0, out.stderr
    members = [m for s in json.loads(out.stdout)["broker_sets"] for m in s["members"]]
    return str(next(m["rocketmq_endpoint"] for m in members if m["role"] == "master"))


def test_only_calls_signed_by_a_configured_access_key_are_served(
    cluster_factory: Any, tmp_path: Path
) -> None:
    topology = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    topology["broker"]["rocketmq_access_keys"] = [
        {"access_key": "ak", "secret_key": "sk-1"},
        {"access_key": "second", "secret_key": "sk-2"},
    ]
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump(topology))
    cluster = cluster_factory(topology=path, name="auth")
    create_topic(cluster, "rmq-auth")  # 4 queues: a receive reads all of them
    endpoint = master_endpoint(cluster)

    ok = drive(endpoint, "signed", "rmq-auth", "g-auth", "ak", "sk-1")
    assert ok.get("received") == ok.get("sent") is not None, ok
    other = drive(endpoint, "signed", "rmq-auth", "g-auth", "second", "sk-2")
    assert other.get("received") == other.get("sent") is not None, other

    # a wrong secret, and the client's empty credentials: refused from the first call on (the
    # client reports the route it could not get; the raw calls below show the code it was given)
    for ak, sk in (("ak", "sk-2"), ("", "")):
        refused = drive(endpoint, "signed", "rmq-auth", "g-auth", ak, sk)
        assert "route" in refused.get("send_error", ""), refused

    raw = drive(endpoint, "unsigned", "rmq-auth", "sk-1")
    assert raw == {
        "query_route": "UNAUTHORIZED",
        "query_route_old": "UNAUTHORIZED",  # 20 minutes ago: beyond the 15-minute bound
        "query_route_wrong": "UNAUTHORIZED",
        "query_route_signed": "OK",
        "telemetry": ["UNAUTHORIZED"],  # one refusal, then the stream ends
    }
