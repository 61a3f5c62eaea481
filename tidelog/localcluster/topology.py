"""The topology file of `tide cluster up`: reading it and refusing what cannot be started.

    host: 127.0.0.1
    ports: auto                   # or the first port number
    controller: {nodes: 1, heartbeat_interval_ms: 1000, heartbeat_timeout_ms: 3000,
                 datacenters: [dc-a, dc-b, dc-c]}   # with --netns: node i lives in datacenters[i]
    broker_sets:
      - {name: broker-a, replicas: 2, datacenters: [dc-a, dc-b]}
    broker: {flush: async, replication: sync, ...}   # deploy/CONFIG.md keys for every broker
    lab: {wan_delay_ms: 2}        # with --netns: one-way delay between datacenters

(see deploy/local.yaml). Every refusal is a ConfigError naming the key at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidelog.errors import ConfigError

_TOP = {"host", "ports", "controller", "broker_sets", "broker", "lab"}
_SET_KEYS = {"name", "replicas", "datacenters"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # also a file name: <name>-<replica>.yaml, .log


@dataclass
class Topology:
    host: str = "127.0.0.1"
    ports: str | int = "auto"
    controller: dict[str, Any] = field(default_factory=dict)
    broker_sets: list[dict[str, Any]] = field(default_factory=list)
    broker: dict[str, Any] = field(default_factory=dict)
    lab: dict[str, Any] = field(default_factory=dict)  # with --netns: {wan_delay_ms: N}


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    doc = _read_mapping(p)
    unknown = sorted(set(doc) - _TOP)
    if unknown:
        raise ConfigError(f"{p}: unknown key {unknown[0]!r}", key=unknown[0])
    topo = Topology(**{k: v for k, v in doc.items() if v is not None})
    _check_sections(p, topo)
    _check_broker_sets(p, topo.broker_sets)
    if topo.controller.get("nodes", 1) not in (1, 3, 5):
        raise ConfigError(f"{p}: controller.nodes must be 1, 3 or 5", key="controller.nodes")
    if topo.ports != "auto" and (not isinstance(topo.ports, int) or not 1024 <= topo.ports < 65000):
        raise ConfigError(f"{p}: ports must be 'auto' or a first port number", key="ports")
    return topo


def _read_mapping(p: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read topology {p}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return doc


def _check_sections(p: Path, topo: Topology) -> None:
    if not isinstance(topo.host, str) or not topo.host:
        raise ConfigError(f"{p}: host must be an address such as 127.0.0.1", key="host")
    for key in ("controller", "broker", "lab"):
        if not isinstance(getattr(topo, key), dict):
            raise ConfigError(f"{p}: {key} must be a mapping of settings", key=key)
    if not isinstance(topo.broker_sets, list) or not topo.broker_sets:
        raise ConfigError(f"{p}: broker_sets must list at least one broker set", key="broker_sets")


def _check_broker_sets(p: Path, broker_sets: list[Any]) -> None:
    names = set()
    for i, bs in enumerate(broker_sets):
        replicas = bs.get("replicas", 0) if isinstance(bs, dict) else 0
        if (
            not isinstance(bs, dict)
            or not isinstance(bs.get("name"), str)
            or not _NAME.fullmatch(bs["name"])
            or type(replicas) is not int
            or replicas < 1
        ):
            raise ConfigError(
                f"{p}: broker_sets[{i}] needs a name (letters, digits, '.', '_', '-') and replicas >= 1",
                key=f"broker_sets[{i}]",
            )
        unknown = sorted(set(bs) - _SET_KEYS)
        if unknown:
            raise ConfigError(
                f"{p}: broker_sets[{i}] has an unknown key {unknown[0]!r} "
                f"(known: {', '.join(sorted(_SET_KEYS))})",
                key=f"broker_sets[{i}].{unknown[0]}",
            )
        if bs["name"] in names:
            raise ConfigError(f"{p}: broker set {bs['name']!r} is listed twice", key=f"broker_sets[{i}]")
        names.add(bs["name"])
        dcs = bs.get("datacenters")
        if dcs is not None and (not isinstance(dcs, list) or not all(isinstance(d, str) for d in dcs)):
            raise ConfigError(
                f"{p}: broker_sets[{i}].datacenters must be a list of names",
                key=f"broker_sets[{i}].datacenters",
            )
