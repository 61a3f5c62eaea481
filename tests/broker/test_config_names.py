"""A broker set name that could climb out of a directory (`../../etc`) is refused by the broker's
config, as it is by a topology file, whose broker set entries take known keys only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.config import from_mapping
from tidelog.errors import ConfigError
from tidelog.localcluster import load_topology

BASE = {"data_dir": "/tmp/x", "controllers": "127.0.0.1:1", "secret": "s"}


@pytest.mark.parametrize("name", ["../../etc", "..", ".hidden", "a/b", "", "x" * 128, "a b"])
def test_a_broker_set_name_that_is_not_a_plain_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, "broker_set": name})
    assert err.value.details.get("key") == "broker_set"


@pytest.mark.parametrize("name", ["broker-a", "a", "set_1.eu", "x" * 127])
def test_plain_names_are_accepted(name: str) -> None:
    assert from_mapping({**BASE, "broker_set": name}).broker_set == name


def test_an_unknown_key_in_a_topology_broker_set_is_refused(tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    topo.write_text("broker_sets: [{name: broker-a, replicas: 2, replica: 3}]\n")
    with pytest.raises(ConfigError, match="unknown key 'replica'") as err:
        load_topology(topo)
    assert err.value.details.get("key") == "broker_sets[0].replica"
    topo.write_text("broker_sets: [{name: ../../etc, replicas: 2}]\n")
    with pytest.raises(ConfigError, match="needs a name"):
        load_topology(topo)
    topo.write_text("broker_sets: [{name: broker-a, replicas: 2, datacenters: [a, b]}]\n")
    assert load_topology(topo).broker_sets[0]["replicas"] == 2
