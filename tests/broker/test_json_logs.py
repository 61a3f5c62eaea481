"""Scenario: brokers and a controller run with `log_format: json`; a failover happens; every line
each process wrote is one JSON object, and the role changes carry the broker set, broker id and
epoch as fields (tidelog/logs.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.broker.conftest import SET, TOPIC, BrokerCluster
from tests.procs import Proc, wait_until

pytestmark = pytest.mark.slow


def _lines(proc: Proc) -> list[dict[str, Any]]:
    """Every line of the process's log, each parsed as JSON (a line that is not fails the test)."""
    out = []
    for n, line in enumerate(proc.output().splitlines(), 1):
        try:
            doc = json.loads(line)
        except ValueError:
            pytest.fail(f"{proc.name} log line {n} is not JSON: {line[:300]}")
        assert isinstance(doc, dict), f"{proc.name} log line {n} is not an object"
        assert {"time", "level", "logger", "message"} <= set(doc), f"{proc.name} line {n}: {doc}"
        out.append(doc)
    return out


def test_json_logs_carry_the_replica_identity_through_a_failover(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    c = broker_cluster(2, log_format="json", controller_options={"extra": {"log_format": "json"}})
    bs = c.bs
    first = bs.wait_master()
    reply = bs.clients[first].produce(TOPIC, [b"x" * 100 for _ in range(10)])
    assert len(reply.results) == 10
    bs.procs[first].stop()  # the survivor is elected at a higher epoch
    survivor = bs.wait_master(timeout=30, exclude=first)
    epoch = bs.status(survivor).master_epoch
    assert epoch >= 2

    def promoted() -> list[dict[str, Any]]:
        return [d for d in _lines(bs.procs[survivor]) if "promoted to master" in d["message"]]

    line = wait_until(promoted, 10, 0.2, what="the survivor's promotion line")[-1]
    assert line["broker_set"] == SET
    assert line["broker_id"] == bs.status(survivor).broker_id
    assert line["epoch"] == epoch and line["role"] == "master"
    assert line["max_offset"] > 0, "the promotion line carries the offset the new epoch starts at"
    # The stopped replica's log, its shutdown included, is JSON too; so is the controller's,
    # whose election line names the broker set and the new epoch.
    assert any(d.get("role") == "master" for d in _lines(bs.procs[first]))
    ctrl = [d for p in c.cc.procs.values() for d in _lines(p)]
    elected = [d for d in ctrl if "elected broker" in d["message"]]
    assert elected and elected[-1]["broker_set"] == SET and elected[-1]["epoch"] == epoch
    assert all("node_id" in d for d in ctrl if d["logger"].startswith("tidelog.controller.node"))
