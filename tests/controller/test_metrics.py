"""controller/metrics.py and the `metrics_address` keys: Raft and broker-set series, config checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from tidelog.broker import config as broker_config
from tidelog.controller import config as controller_config
from tidelog.controller.metrics import broker_set_metrics, raft_metrics
from tidelog.controller.model import BrokerSet
from tidelog.controller.raft import RaftStatus
from tidelog.errors import ConfigError


class _Fixed(Collector):
    def __init__(self, metrics: list[Any]) -> None:
        self.metrics = metrics

    def collect(self) -> Any:
        return iter(self.metrics)


def _registry(metrics: list[Any]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    return registry


def test_raft_series_of_a_leader_and_of_a_node_without_one() -> None:
    leader = RaftStatus("c1", "leader", "c1", "127.0.0.1:1", 7, 42, 41, True)
    value = _registry(raft_metrics("c1", leader)).get_sample_value
    assert value("tidelog_raft_term", {"node_id": "c1"}) == 7
    assert value("tidelog_raft_is_leader", {"node_id": "c1"}) == 1
    assert value("tidelog_raft_has_leader", {"node_id": "c1"}) == 1
    assert value("tidelog_raft_commit_index", {"node_id": "c1"}) == 42
    assert value("tidelog_raft_last_applied", {"node_id": "c1"}) == 41
    lost = RaftStatus("c2", "candidate", None, None, 8, 42, 42, True)
    value = _registry(raft_metrics("c2", lost)).get_sample_value
    assert value("tidelog_raft_is_leader", {"node_id": "c2"}) == 0
    assert value("tidelog_raft_has_leader", {"node_id": "c2"}) == 0


def test_broker_set_series_and_alive_brokers_only_on_the_leader() -> None:
    a = BrokerSet(
        "broker-a",
        {1: None, 2: None},
        master_id=1,
        master_epoch=3,
        sync_state_set=frozenset({1, 2}),
        sss_epoch=5,
    )  # type: ignore[dict-item]
    b = BrokerSet(
        "broker-b", {1: None}, master_id=None, master_epoch=2, sync_state_set=frozenset(), sss_epoch=2
    )  # type: ignore[dict-item]
    value = _registry(broker_set_metrics("c1", [a, b], {"broker-a": 2})).get_sample_value
    sa, sb = {"node_id": "c1", "broker_set": "broker-a"}, {"node_id": "c1", "broker_set": "broker-b"}
    assert value("tidelog_controller_broker_sets", {"node_id": "c1"}) == 2
    assert value("tidelog_controller_brokers", sa) == 2
    assert value("tidelog_controller_master_elections_total", sa) == 3
    assert value("tidelog_controller_master_epoch", sb) == 2
    assert value("tidelog_controller_has_master", sa) == 1
    assert value("tidelog_controller_has_master", sb) == 0
    assert value("tidelog_controller_sync_state_set_size", sa) == 2
    assert value("tidelog_controller_sync_state_set_changes_total", sa) == 5
    assert value("tidelog_controller_alive_brokers", sa) == 2
    assert value("tidelog_controller_alive_brokers", sb) == 0
    follower = _registry(broker_set_metrics("c2", [a], None)).get_sample_value
    assert follower("tidelog_controller_alive_brokers", {"node_id": "c2", "broker_set": "broker-a"}) is None


def _nodes(**extra: Any) -> list[dict[str, Any]]:
    return [{"id": "c1", "raft": "127.0.0.1:9801", "grpc": "127.0.0.1:9701", **extra}]


def test_controller_metrics_address_is_per_node_and_checked(tmp_path: Path) -> None:
    cfg = controller_config.parse(
        {"nodes": _nodes(metrics_address="127.0.0.1:9601"), "data_dir": str(tmp_path)}
    )
    assert cfg.self_node.metrics_address == "127.0.0.1:9601"
    assert (
        controller_config.parse({"nodes": _nodes(), "data_dir": str(tmp_path)}).self_node.metrics_address
        == ""
    )
    for bad, match in (("nope", "must be 'host:port'"), ("127.0.0.1:9701", "also its raft or grpc")):
        with pytest.raises(ConfigError, match=match) as err:
            controller_config.parse({"nodes": _nodes(metrics_address=bad), "data_dir": str(tmp_path)})
        assert "metrics_address" in str(err.value)


def _broker(**extra: Any) -> dict[str, Any]:
    return {
        "broker_set": "b",
        "data_dir": "/tmp/x",
        "controllers": "127.0.0.1:1",
        "secret": "s" * 32,
        **extra,
    }


def test_broker_metrics_address_is_optional_and_checked() -> None:
    assert broker_config.from_mapping(_broker()).metrics_address == ""
    assert (
        broker_config.from_mapping(_broker(metrics_address="0.0.0.0:9500")).metrics_address == "0.0.0.0:9500"
    )
    for bad, match in (
        ("9500", "must be host:port"),
        (9500, "must be a string"),
        ("127.0.0.1:10911", "also the listen or ha_listen"),
    ):
        with pytest.raises(ConfigError, match=match):
            broker_config.from_mapping(_broker(metrics_address=bad))
