"""Controller configuration: the YAML file a controller node starts from, validated up front.

One file describes the whole controller cluster (every node's id, Raft address and gRPC address)
so that all nodes can share it; which node a process is comes from `node_id` in the file or the
`--node-id` option. Each node keeps its Raft journal and snapshot under `<data_dir>/<node id>/`.

Every problem is a `ConfigError` naming the offending key, raised before anything listens.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tidelog.clusterauth import secret_from_env
from tidelog.errors import ConfigError
from tidelog.guard import AuthSettings
from tidelog.guard import parse_section as parse_auth
from tidelog.tlsconfig import TlsSettings, parse_section

SECRET_ENV = "TIDE_CONTROLLER_SECRET"

_TOP_KEYS = {
    "nodes",
    "node_id",
    "data_dir",
    "secret",
    "heartbeat_interval_ms",
    "heartbeat_timeout_ms",
    "enable_elect_unclean_master",
    "rpo_bound_bytes",
    "raft",
    "max_meta_value_bytes",
    "max_topics",
    "max_metadata_entries",
    "placement",
    "placement_audit_interval_ms",
    "log_format",
    "log_file",
    "log_max_bytes",
    "log_backups",
    "tls",
    "auth",
}
_RAFT_KEYS = {
    "election_min_timeout_ms",
    "election_max_timeout_ms",
    "append_entries_period_ms",
    "leader_fallback_timeout_ms",
    "connection_retry_ms",
    "log_compaction_min_entries",
}


@dataclass(frozen=True)
class NodeAddress:
    id: str
    raft: str  # host:port of the PySyncObj port (peers only)
    grpc: str  # host:port of the gRPC service (brokers, clients, operators)
    # host:port of the Prometheus /metrics, /healthz, /readyz endpoint (deploy/METRICS.md); "": off
    metrics_address: str = ""


@dataclass(frozen=True)
class RaftTuning:
    """PySyncObj timings. Defaults favour fast failover on a LAN over chattiness."""

    election_min_timeout_ms: int = 500
    election_max_timeout_ms: int = 1500
    append_entries_period_ms: int = 100
    # PySyncObj's default (30 s) would let an isolated leader believe it leads for 30 s.
    leader_fallback_timeout_ms: int = 3000
    connection_retry_ms: int = 1000
    log_compaction_min_entries: int = 5000


@dataclass(frozen=True)
class ControllerConfig:
    nodes: tuple[NodeAddress, ...]
    node_id: str
    data_dir: Path
    secret: str | None = None
    heartbeat_interval_ms: int = 1000
    heartbeat_timeout_ms: int = 5000
    enable_elect_unclean_master: bool = False
    # 0: none; else a master alone in its SyncStateSet acknowledges at most this far past the last
    # offset every controller's log holds of its reports (ha/rpobound.py, RULES.md L10)
    rpo_bound_bytes: int = 0
    max_meta_value_bytes: int = 1 << 20
    max_topics: int = 200_000  # creates past it answer TOPIC_LIMIT_REACHED (bench.scale: ~3 KB each)
    # metadata entries (ledgers, consumer-group assignments); creates past it answer
    # METADATA_LIMIT_REACHED (bench.scale: ~600 bytes each, a snapshot restore ~8 s a million)
    max_metadata_entries: int = 2_000_000
    raft: RaftTuning = field(default_factory=RaftTuning)
    # broker set -> the datacenters that must hold a replica (RULES.md PL1); unnamed sets: their
    # members' labels
    placement: dict[str, tuple[str, ...]] = field(default_factory=dict)
    placement_audit_interval_ms: int = 1000
    # "text" log lines, or one JSON object per line with the node's identity (tidelog/logs.py)
    log_format: str = "text"
    # "": log to standard error; a path: log there, rotated at log_max_bytes and keeping
    # log_backups old files, so the logs take at most (log_backups + 1) × log_max_bytes.
    # "{node_id}" in the path is this node's id (one config serves every node)
    log_file: str = ""
    log_max_bytes: int = 64 << 20
    log_backups: int = 4
    # TLS on the gRPC port (tidelog/tlsconfig.py); None: plain text. The Raft port is PySyncObj's,
    # encrypted with the cluster secret instead (docs/ARCHITECTURE.md §12.1)
    tls: TlsSettings | None = None
    # users' calls must be signed and permitted (tidelog/guard.py); None: auth off
    auth: AuthSettings | None = None

    @property
    def self_node(self) -> NodeAddress:
        for node in self.nodes:
            if node.id == self.node_id:
                return node
        raise ConfigError(f"node_id {self.node_id!r} is not one of nodes[].id", key="node_id")

    @property
    def peers(self) -> tuple[NodeAddress, ...]:
        return tuple(n for n in self.nodes if n.id != self.node_id)

    @property
    def node_dir(self) -> Path:
        return self.data_dir / self.node_id

    def node(self, node_id: str) -> NodeAddress:
        """The configured addresses of node `node_id` (a member named by the identity file)."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise ConfigError(
            f"node {node_id!r} is a member of this controller cluster but not one of nodes[].id",
            key="nodes",
            hint="every member the identity file (cluster.json) names needs its addresses in nodes[]",
        )

    def node_by_raft(self, raft_address: str) -> NodeAddress | None:
        for node in self.nodes:
            if node.raft == raft_address:
                return node
        return None


def _host_port(key: str, value: Any) -> str:
    if not isinstance(value, str) or value.count(":") != 1:
        raise ConfigError(f"{key} must be 'host:port' (got {value!r})", key=key)
    host, port = value.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key} must be 'host:port' with a port in 1..65535 (got {value!r})", key=key)
    return value


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer (got {value!r})", key=key)
    return value


def _non_negative_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key} must be 0 or a positive integer (got {value!r})", key=key)
    return value


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string (got {value!r})", key=key)
    return value


_LABEL = re.compile(r"^[A-Za-z0-9_.%-]{1,127}$")


def _placement(raw: Any) -> dict[str, tuple[str, ...]]:
    """`placement: {broker-a: [dc-a, dc-b]}`: which datacenters must hold each broker set."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError("placement must map broker set names to lists of datacenters", key="placement")
    out = {}
    for name, dcs in raw.items():
        key = f"placement.{name}"
        if not isinstance(name, str) or not _LABEL.match(name):
            raise ConfigError(f"{key}: a broker set name is 1..127 of A-Z a-z 0-9 _ . % -", key=key)
        if (
            not isinstance(dcs, list)
            or not dcs
            or not all(isinstance(d, str) and _LABEL.match(d) for d in dcs)
            or len(set(dcs)) != len(dcs)
        ):
            raise ConfigError(
                f"{key} must be a non-empty list of distinct datacenter names (got {dcs!r})", key=key
            )
        out[name] = tuple(dcs)
    return out


def _check_top_keys(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("the controller config must be a mapping", key="<root>")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(sorted(unknown))}", key=sorted(unknown)[0])
    return raw


def _node(i: int, item: Any) -> NodeAddress:
    prefix = f"nodes[{i}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{prefix} must be a mapping with id, raft, grpc", key=prefix)
    extra = set(item) - {"id", "raft", "grpc", "metrics_address"}
    if extra:
        raise ConfigError(f"{prefix} has unknown key(s) {sorted(extra)}", key=f"{prefix}.{sorted(extra)[0]}")
    nid = item.get("id")
    if nid is None or not str(nid).strip():
        raise ConfigError(f"{prefix}.id is required", key=f"{prefix}.id")
    metrics = item.get("metrics_address") or ""
    return NodeAddress(
        str(nid),
        _host_port(f"{prefix}.raft", item.get("raft")),
        _host_port(f"{prefix}.grpc", item.get("grpc")),
        _host_port(f"{prefix}.metrics_address", metrics) if metrics else "",
    )


def _nodes(raw_nodes: Any) -> tuple[NodeAddress, ...]:
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError("nodes must be a non-empty list", key="nodes")
    if len(raw_nodes) not in (1, 3, 5):
        raise ConfigError(f"nodes must list 1, 3 or 5 controllers (got {len(raw_nodes)})", key="nodes")
    nodes = tuple(_node(i, item) for i, item in enumerate(raw_nodes))
    for attr in ("id", "raft", "grpc", "metrics_address"):
        values = [getattr(n, attr) for n in nodes if getattr(n, attr)]
        if len(set(values)) != len(values):
            raise ConfigError(f"nodes[].{attr} must be unique", key=f"nodes.{attr}")
    for i, n in enumerate(nodes):
        if n.metrics_address in (n.raft, n.grpc):
            raise ConfigError(
                f"nodes[{i}].metrics_address {n.metrics_address} is also its raft or grpc address",
                key=f"nodes[{i}].metrics_address",
            )
    return nodes


def _node_id(chosen: Any, nodes: tuple[NodeAddress, ...]) -> str:
    """Which of `nodes` this process is (`--node-id`, else the file's `node_id`)."""
    if chosen is None:
        if len(nodes) != 1:
            raise ConfigError(
                "node_id is required with more than one node (or pass --node-id)", key="node_id"
            )
        chosen = nodes[0].id
    chosen = str(chosen)
    if chosen not in {n.id for n in nodes}:
        raise ConfigError(f"node_id {chosen!r} is not one of nodes[].id", key="node_id")
    return chosen


def _secret(key: str, secret: Any) -> str | None:
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ConfigError(f"{key} must be a non-empty string", key=key)
    return secret or os.environ.get(SECRET_ENV) or secret_from_env()


def _log_format(key: str, value: Any) -> str:
    if value not in ("text", "json"):
        raise ConfigError(f"{key} must be text or json (got {value!r})", key=key)
    return str(value)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false", key=key)
    return value


#: The top-level settings besides the nodes, this node and the data dir: (key, check, default),
#: checked in this order, so a file with several mistakes is told about the same one first.
_SETTINGS: tuple[tuple[str, Callable[[str, Any], Any], Any], ...] = (
    ("secret", _secret, None),
    ("enable_elect_unclean_master", _flag, False),
    ("rpo_bound_bytes", _non_negative_int, 0),
    ("heartbeat_interval_ms", _positive_int, 1000),
    ("heartbeat_timeout_ms", _positive_int, 5000),
    ("max_meta_value_bytes", _positive_int, 1 << 20),
    ("max_topics", _positive_int, 200_000),
    ("max_metadata_entries", _positive_int, 2_000_000),
    ("placement", lambda _key, value: _placement(value), None),
    ("placement_audit_interval_ms", _positive_int, 1000),
    ("log_format", _log_format, "text"),
    ("log_file", lambda key, value: _text(key, value), ""),
    ("log_max_bytes", _positive_int, 64 << 20),
    ("log_backups", _positive_int, 4),  # Python's rotation never happens with none
    ("tls", lambda _key, value: None if value is None else parse_section(value, "controller config"), None),
)


def parse(raw: Any, *, node_id: str | None = None, data_dir: str | None = None) -> ControllerConfig:
    """Validate a parsed YAML document; `node_id`/`data_dir` override the file's values."""
    raw = _check_top_keys(raw)
    nodes = _nodes(raw.get("nodes"))
    chosen = _node_id(node_id if node_id is not None else raw.get("node_id"), nodes)
    dd = data_dir if data_dir is not None else raw.get("data_dir")
    if not dd or not isinstance(dd, str):
        raise ConfigError("data_dir is required", key="data_dir")
    settings = {key: check(key, raw.get(key, default)) for key, check, default in _SETTINGS}
    cfg = ControllerConfig(nodes=nodes, node_id=chosen, data_dir=Path(dd), **settings)
    cfg = replace(cfg, log_file=cfg.log_file.replace("{node_id}", chosen))
    if cfg.heartbeat_timeout_ms <= cfg.heartbeat_interval_ms:
        raise ConfigError(
            "heartbeat_timeout_ms must be larger than heartbeat_interval_ms", key="heartbeat_timeout_ms"
        )
    auth = parse_auth(raw.get("auth"), "controller config", cfg.tls is not None)
    return replace(cfg, raft=_raft_tuning(raw.get("raft") or {}), auth=auth)


#: Rules between the Raft timings: (key that is wrong, test it must pass, message).
_RAFT_RULES: tuple[tuple[str, Callable[[RaftTuning], bool], str], ...] = (
    (
        "election_min_timeout_ms",
        lambda t: t.election_min_timeout_ms > 3 * t.append_entries_period_ms,
        "must exceed 3 × append_entries_period_ms",
    ),
    (
        "election_max_timeout_ms",
        lambda t: t.election_max_timeout_ms > t.election_min_timeout_ms,
        "must exceed election_min_timeout_ms",
    ),
    (
        "leader_fallback_timeout_ms",
        lambda t: t.leader_fallback_timeout_ms > t.append_entries_period_ms,
        "must exceed append_entries_period_ms",
    ),
    ("log_compaction_min_entries", lambda t: t.log_compaction_min_entries >= 2, "must be at least 2"),
)


def _raft_tuning(raw_raft: Any) -> RaftTuning:
    if not isinstance(raw_raft, dict):
        raise ConfigError("raft must be a mapping", key="raft")
    unknown = set(raw_raft) - _RAFT_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s) under raft: {sorted(unknown)}", key=f"raft.{sorted(unknown)[0]}")
    tuning = RaftTuning(**{k: _positive_int(f"raft.{k}", v) for k, v in raw_raft.items()})
    for key, holds, message in _RAFT_RULES:
        if not holds(tuning):
            raise ConfigError(f"raft.{key} {message}", key=f"raft.{key}")
    return tuning


def load(
    path: str | os.PathLike[str], *, node_id: str | None = None, data_dir: str | None = None
) -> ControllerConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", key="--config") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}", key="--config") from exc
    return parse(raw, node_id=node_id, data_dir=data_dir)
