"""Controller YAML config: defaults, overrides, and a ConfigError naming the key for each mistake."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from tidelog.clusterauth import SECRET_ENV as CLUSTER_SECRET_ENV
from tidelog.controller.config import SECRET_ENV, ControllerConfig, load, parse
from tidelog.controller.node import with_secret
from tidelog.errors import ConfigError

N3 = [{"id": f"c{i}", "raft": f"127.0.0.1:{9800 + i}", "grpc": f"127.0.0.1:{9700 + i}"} for i in (1, 2, 3)]


def _raw(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"data_dir": "d", "nodes": N3, "node_id": "c2", "secret": "s3cret"}
    raw.update(over)
    return raw


def test_defaults_and_node_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    cfg = parse(_raw())
    assert (cfg.heartbeat_interval_ms, cfg.heartbeat_timeout_ms) == (1000, 5000)
    assert cfg.enable_elect_unclean_master is False
    assert cfg.self_node.grpc == "127.0.0.1:9702"
    assert [n.id for n in cfg.peers] == ["c1", "c3"]
    assert cfg.node_dir == Path("d") / "c2"
    assert parse(_raw(), node_id="c3").node_id == "c3"
    single = parse({"data_dir": "d", "nodes": N3[:1], "secret": "s"})
    assert single.node_id == "c1" and single.secret == "s"


def test_secret_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLUSTER_SECRET_ENV, raising=False)
    monkeypatch.setenv(SECRET_ENV, "from-env")
    raw = _raw()
    del raw["secret"]
    assert parse(raw).secret == "from-env"


def test_multi_node_without_secret_refuses_and_a_single_node_generates_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(CLUSTER_SECRET_ENV, raising=False)
    raw = _raw()
    del raw["secret"]
    raw["data_dir"] = str(tmp_path)
    with pytest.raises(ConfigError) as info:
        with_secret(parse(raw))
    assert info.value.details["key"] == "secret"
    # one node: a secret generated once, kept (0600) and used again after a restart
    single = parse({"data_dir": str(tmp_path), "nodes": N3[:1]})
    assert single.secret is None
    first = with_secret(single).secret
    assert first and len(first) >= 32
    path = single.node_dir / "cluster.secret"
    assert path.stat().st_mode & 0o777 == 0o600
    assert with_secret(single).secret == first


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"nodes": []}, "nodes"),
        ({"nodes": N3[:2]}, "nodes"),  # 2 nodes: no majority survives a failure
        ({"nodes": [N3[0], {**N3[1], "id": "c1"}, N3[2]]}, "nodes.id"),
        ({"nodes": [N3[0], {**N3[1], "grpc": N3[0]["grpc"]}, N3[2]]}, "nodes.grpc"),
        ({"nodes": [N3[0], {**N3[1], "raft": "nohost"}, N3[2]]}, "nodes[1].raft"),
        ({"nodes": [N3[0], {**N3[1], "grpc": "h:99999"}, N3[2]]}, "nodes[1].grpc"),
        ({"nodes": [N3[0], {"raft": "h:1", "grpc": "h:2"}, N3[2]]}, "nodes[1].id"),
        ({"nodes": [N3[0], {**N3[1], "port": 1}, N3[2]]}, "nodes[1].port"),
        ({"node_id": "c9"}, "node_id"),
        ({"node_id": None}, "node_id"),
        ({"data_dir": ""}, "data_dir"),
        ({"heartbeat_interval_ms": 0}, "heartbeat_interval_ms"),
        ({"heartbeat_timeout_ms": "5s"}, "heartbeat_timeout_ms"),
        ({"heartbeat_interval_ms": 3000, "heartbeat_timeout_ms": 2000}, "heartbeat_timeout_ms"),
        ({"enable_elect_unclean_master": "yes"}, "enable_elect_unclean_master"),
        ({"secret": ""}, "secret"),
        (
            {"raft": {"election_min_timeout_ms": 200, "append_entries_period_ms": 100}},
            "raft.election_min_timeout_ms",
        ),
        ({"raft": {"elect": 1}}, "raft.elect"),
        ({"heartbeat": 1}, "heartbeat"),
    ],
)
def test_each_mistake_names_its_key(over: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(_raw(**over))
    assert info.value.details["key"] == key


def test_load_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    good = tmp_path / "good.yaml"
    good.write_text("data_dir: d\nnodes:\n  - {id: a, raft: '127.0.0.1:1', grpc: '127.0.0.1:2'}\n")
    assert load(good, data_dir="elsewhere").data_dir == Path("elsewhere")


def test_deploy_examples_are_valid() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    assert len(load(deploy / "controller-1.yaml").nodes) == 1
    cfg = load(deploy / "controller-3.yaml", node_id="c2")
    assert [n.id for n in cfg.nodes] == ["c1", "c2", "c3"] and cfg.self_node.id == "c2"


def test_an_omitted_setting_takes_the_dataclass_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser's table of settings carries its own defaults: they must not drift from the
    # dataclass's, which code that builds a ControllerConfig directly gets.
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(CLUSTER_SECRET_ENV, raising=False)
    cfg = parse({"data_dir": "d", "nodes": N3[:1]})
    for f in fields(ControllerConfig):
        if f.name in ("nodes", "node_id", "data_dir"):
            continue
        default = f.default_factory() if f.default is MISSING else f.default
        assert getattr(cfg, f.name) == default, f.name
