"""Controller config keys for placement (controller/config.py; rules in controller/placement.py,
controller/RULES.md PL1-PL7): `placement` maps a broker set to the datacenters that must hold it,
`placement_audit_interval_ms` paces the leader's audit. Each mistake is a ConfigError naming its key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidelog.controller.config import load, parse
from tidelog.errors import ConfigError

N3 = [{"id": f"c{i}", "raft": f"127.0.0.1:{9800 + i}", "grpc": f"127.0.0.1:{9700 + i}"} for i in (1, 2, 3)]


def _raw(**over: Any) -> dict[str, Any]:
    # a secret is given so the result never depends on the environment
    raw: dict[str, Any] = {"data_dir": "d", "nodes": N3, "node_id": "c2", "secret": "s3cret"}
    raw.update(over)
    return raw


def test_placement_is_parsed_into_tuples_with_the_audit_interval() -> None:
    cfg = parse(
        _raw(placement={"broker-a": ["dc-a", "dc-b"], "broker-b": ["dc-c"]}, placement_audit_interval_ms=250)
    )
    assert cfg.placement == {"broker-a": ("dc-a", "dc-b"), "broker-b": ("dc-c",)}
    # tuples: the frozen config cannot be changed through the lists it was parsed from
    assert all(isinstance(dcs, tuple) for dcs in cfg.placement.values())
    assert cfg.placement_audit_interval_ms == 250


def test_placement_defaults_to_member_labels_and_a_one_second_audit() -> None:
    cfg = parse(_raw())
    assert (cfg.placement, cfg.placement_audit_interval_ms) == ({}, 1000)
    # `placement:` with nothing under it in YAML is null: the same as absent
    assert parse(_raw(placement=None)).placement == {}


def test_placement_is_read_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "data_dir: d\nsecret: s\nnodes:\n  - {id: a, raft: '127.0.0.1:1', grpc: '127.0.0.1:2'}\n"
        "placement:\n  broker-a: [dc-a, dc-b]\nplacement_audit_interval_ms: 500\n"
    )
    cfg = load(path)
    assert cfg.placement == {"broker-a": ("dc-a", "dc-b")}
    assert cfg.placement_audit_interval_ms == 500


@pytest.mark.parametrize(
    ("over", "key"),
    [
        pytest.param({"placement": ["broker-a"]}, "placement", id="placement-a-list"),
        pytest.param({"placement": "broker-a: [dc-a]"}, "placement", id="placement-a-string"),
        pytest.param({"placement": {"broker-a": []}}, "placement.broker-a", id="empty-list"),
        pytest.param({"placement": {"broker-a": "dc-a"}}, "placement.broker-a", id="string-not-list"),
        pytest.param({"placement": {"broker-a": None}}, "placement.broker-a", id="null-list"),
        pytest.param(
            {"placement": {"broker-a": ["dc-a", "dc-b", "dc-a"]}}, "placement.broker-a", id="duplicates"
        ),
        pytest.param({"placement": {"broker-a": ["dc-a", 7]}}, "placement.broker-a", id="non-string-dc"),
        pytest.param({"placement": {"broker-a": ["dc a"]}}, "placement.broker-a", id="bad-dc-name"),
        pytest.param({"placement": {"broker-a": [""]}}, "placement.broker-a", id="empty-dc-name"),
        pytest.param({"placement": {"broker a": ["dc-a"]}}, "placement.broker a", id="bad-set-name"),
        pytest.param({"placement": {"": ["dc-a"]}}, "placement.", id="empty-set-name"),
        pytest.param({"placement": {7: ["dc-a"]}}, "placement.7", id="non-string-set-name"),
        pytest.param({"placement": {"b" * 128: ["dc-a"]}}, "placement." + "b" * 128, id="set-name-too-long"),
        # several sets: the key names the one that is wrong
        pytest.param(
            {"placement": {"broker-a": ["dc-a"], "broker-b": []}},
            "placement.broker-b",
            id="names-the-bad-set",
        ),
        pytest.param({"placement_audit_interval_ms": 0}, "placement_audit_interval_ms", id="interval-zero"),
        pytest.param(
            {"placement_audit_interval_ms": -5}, "placement_audit_interval_ms", id="interval-negative"
        ),
        pytest.param(
            {"placement_audit_interval_ms": "1s"}, "placement_audit_interval_ms", id="interval-string"
        ),
        pytest.param(
            {"placement_audit_interval_ms": True}, "placement_audit_interval_ms", id="interval-bool"
        ),
        pytest.param(
            {"placement_audit_interval_ms": 1.5}, "placement_audit_interval_ms", id="interval-float"
        ),
    ],
)
def test_each_placement_mistake_names_its_key(over: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(_raw(**over))
    assert info.value.details["key"] == key
    assert key in info.value.message


def test_placement_keys_are_known_not_refused_as_unknown() -> None:
    # Before the feature these keys were "unknown key(s)": both are accepted together now.
    cfg = parse(_raw(placement={"broker-a": ["dc-a"]}, placement_audit_interval_ms=1))
    assert (cfg.placement, cfg.placement_audit_interval_ms) == ({"broker-a": ("dc-a",)}, 1)
