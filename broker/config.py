"""Broker configuration: the YAML file one broker replica starts from, validated up front.

Every key is optional except `broker_set`, `data_dir` and `controllers`; each problem is a
ConfigError naming the key, raised before anything listens. deploy/CONFIG.md lists the keys.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from tidelog.client.modes import MAX_ATTEMPTS, MAX_INVISIBLE_MS
from tidelog.clusterauth import secret_from_env
from tidelog.commitlog.log import MIN_CQ_OPEN_FILES
from tidelog.errors import ConfigError
from tidelog.guard import AuthSettings
from tidelog.guard import parse_section as parse_auth
from tidelog.tlsconfig import TlsSettings, parse_section


@dataclass(frozen=True)
class BrokerConfig:
    broker_set: str
    data_dir: Path
    controllers: str  # host:port[,host:port...]
    listen: str = "127.0.0.1:10911"  # gRPC for clients
    ha_listen: str = "127.0.0.1:10912"  # raw TCP for slaves
    # what others are told to connect to, where it differs from the listen address (a wildcard
    # listen, a NAT): empty means the listen address itself
    advertise_address: str = ""
    ha_advertise_address: str = ""
    # produce and pull frames over plain TCP (tidelog/dataport_frames.py): "auto" listens on the host
    # of `listen` with a port the system picks, "" turns the data port off (clients use gRPC)
    data_listen: str = "auto"
    data_advertise_address: str = ""
    # open data-port connections before new ones are closed: each may hold up to 128 MiB of
    # requests and replies (broker/dataport.py), so this bounds the data port's memory
    data_max_connections: int = 64
    # bytes all data-port connections together may hold in frames still arriving (bodies read
    # before the request runs): a frame's claimed length is reserved here before its body is read,
    # so clients that announce large frames and send them slowly (or never) cannot fill memory.
    # A frame larger than this is read alone.
    data_partial_frame_bytes: int = 64 << 20
    # RocketMQ 5's gRPC protocol for the official RocketMQ clients (broker/rocketmq.py): "auto"
    # listens on the host of `listen` with a port the system picks, "" turns it off
    rocketmq_listen: str = "auto"
    rocketmq_advertise_address: str = ""
    # (access key, secret key) pairs the official clients sign their calls with (MQv2-HMAC-SHA1,
    # broker/rocketmqrules.py); empty: the RocketMQ endpoint checks no signature
    rocketmq_access_keys: tuple[tuple[str, str], ...] = ()
    # how far a signed call's x-mq-date-time may be from the broker's clock; 0: not checked.
    # RocketMQ's clients sign only the date, so a captured signature replays within this window:
    # no wider than clock skew needs (docs/SECURITY.md)
    rocketmq_auth_max_skew_s: int = 60
    # the longest delay of a DELAY message (broker/delayrules.py; RocketMQ's default: 40 days);
    # a delay also stays below retention_ms, so a waiting message is never deleted
    rocketmq_max_delay_ms: int = 40 * 24 * 3600 * 1000
    # a half (transactional) message not ended this long after it was stored is checked back with
    # a producer of its topic, and again every interval, at most rocketmq_tx_max_checks times;
    # then it is rolled back (broker/txstate.py)
    rocketmq_tx_check_interval_ms: int = 30_000
    rocketmq_tx_max_checks: int = 15
    # a RocketMQ consumer group's retry policy (RocketMQ keeps it per group; here per broker): a
    # message is delivered at most this many times before it moves to `%DLQ%<group>`, and a push
    # consumer whose listener failed makes it invisible for the n-th of these delays (seconds; the
    # last for later attempts) before it comes back. Default: RocketMQ's.
    rocketmq_max_delivery_attempts: int = 16
    # how long a message received by a consumer that names no invisible duration (the official
    # push consumers: they ask the endpoint to choose, as RocketMQ's proxy does with its
    # defaultInvisibleTimeMills) stays invisible before it is delivered again if not acknowledged
    rocketmq_invisible_ms: int = 30_000
    rocketmq_retry_backoff_s: tuple[int, ...] = (
        1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200
    )  # fmt: skip
    datacenter: str = ""
    rack: str = ""
    priority: int | None = None  # election priority, lower wins
    # the cluster secret (or $TIDE_CLUSTER_SECRET): proves membership to controllers and HA peers
    secret: str | None = None
    # store
    segment_bytes: int = 1 << 30
    flush: str = "async"  # "sync": answer after fdatasync (group commit); "async": background
    flush_interval_ms: int = 500
    max_message_bytes: int = 4 << 20
    flush_timeout_ms: int = 5000
    # descriptors all consume queues hold open together; past it the least recently used close.
    # Lowered at start to fit the open-file limit, which the broker raises (broker/fdlimit.py).
    cq_max_open_files: int = 16384
    # replication
    replication: str = "sync"  # "sync": wait for replica acks; "async": answer after the local append
    in_sync_replicas: int = 2
    min_in_sync_replicas: int = 1
    auto_in_sync_replicas: bool = True
    all_ack_in_sync_state_set: bool = False
    slave_timeout_ms: int = 3000
    ha_max_time_slave_not_catchup_ms: int = 15000
    ha_transfer_batch_bytes: int = 1 << 20
    ha_zero_copy: bool = True  # transfers to plain-TCP slaves by sendfile (ha/master.py)
    ha_heartbeat_interval_ms: int = 1000
    ha_idle_timeout_ms: int = 5000
    # HA connections not yet proven at once (a new one displaces the oldest idle), and proven ones
    ha_max_connections: int = 16
    ha_handshake_timeout_ms: int = 5000  # an HA connection must prove the cluster secret within this
    # controller
    heartbeat_interval_ms: int = 1000  # until the controller says otherwise
    max_concurrent_requests: int = 4096  # calls in progress (long polls included) before refusing
    # reads: a Pull (or ledger Read) asking for more gets at most this much in one reply
    max_pull_bytes: int = 16 << 20
    max_pull_messages: int = 10_000
    # process: "text" log lines, or one JSON object per line with the broker's identity (tidelog/logs.py)
    log_format: str = "text"
    # "": log to standard error; a path: log there, rotated at log_max_bytes and keeping
    # log_backups old files, so the logs take at most (log_backups + 1) × log_max_bytes
    log_file: str = ""
    log_max_bytes: int = 64 << 20
    log_backups: int = 4
    # Prometheus /metrics, /healthz and /readyz over HTTP (deploy/METRICS.md); empty: off
    metrics_address: str = ""
    # retention (docs/ARCHITECTURE.md §6.4): whole segments older than retention_ms, or beyond
    # retention_bytes of log, are deleted in the background; 0 turns a rule off
    retention_ms: int = 72 * 3600 * 1000
    retention_bytes: int = 0
    retention_check_interval_ms: int = 10_000
    # the group-offsets fold is checkpointed this often (and at a clean stop), so that a restart
    # folds only the commits after it (broker/offsetscheckpoint.py); 0: only at a clean stop
    offsets_checkpoint_interval_ms: int = 10_000
    # consumer groups with a committed offset here; a commit of a new group past it answers
    # GROUP_LIMIT_REACHED (each group of 8 queues about 1.5 KB of the broker's memory)
    max_groups: int = 100_000
    scrub_bytes_per_s: int = 16 << 20  # the log re-read against its CRCs (broker/scrub.py); 0: off
    retention_respect_groups: tuple[str, ...] = ()  # keep what these consumer groups have not consumed
    retention_slave_hold_ms: int = 3600 * 1000  # how long a disconnected slave's position still holds
    # TLS on the gRPC, data and HA ports, and toward the controllers and the other brokers
    # (tidelog/tlsconfig.py); None: plain text
    tls: TlsSettings | None = None
    # users' calls must be signed and permitted (tidelog/guard.py); None: auth off
    auth: AuthSettings | None = None

    @property
    def advertised(self) -> str:
        """The client address registered with the controller."""
        return self.advertise_address or self.listen

    @property
    def ha_advertised(self) -> str:
        """The replication address registered with the controller."""
        return self.ha_advertise_address or self.ha_listen

    def with_overrides(self, **kw: Any) -> BrokerConfig:
        return dataclasses.replace(self, **kw)


_CHOICES = {
    "flush": ("sync", "async"),
    "replication": ("sync", "async"),
    "log_format": ("text", "json"),
}
_POSITIVE = {
    "segment_bytes",
    "max_groups",
    "flush_interval_ms",
    "max_message_bytes",
    "flush_timeout_ms",
    "in_sync_replicas",
    "min_in_sync_replicas",
    "slave_timeout_ms",
    "ha_max_time_slave_not_catchup_ms",
    "ha_transfer_batch_bytes",
    "ha_heartbeat_interval_ms",
    "ha_idle_timeout_ms",
    "ha_max_connections",
    "ha_handshake_timeout_ms",
    "data_max_connections",
    "data_partial_frame_bytes",
    "log_max_bytes",
    "log_backups",
    "heartbeat_interval_ms",
    "max_concurrent_requests",
    "max_pull_bytes",
    "max_pull_messages",
    "retention_check_interval_ms",
    "rocketmq_max_delay_ms",
    "rocketmq_tx_check_interval_ms",
    "rocketmq_tx_max_checks",
    "rocketmq_max_delivery_attempts",
    "rocketmq_invisible_ms",
}
_NON_NEGATIVE = {
    "log_backups",
    "offsets_checkpoint_interval_ms",
    "retention_ms",
    "retention_bytes",
    "retention_slave_hold_ms",
    "rocketmq_auth_max_skew_s",
    "scrub_bytes_per_s",
}
_FIELDS = {f.name: f for f in fields(BrokerConfig)}
# A broker set's name shows up in file names (`tide cluster up` writes <name>-<replica>.yaml) and
# log lines: no path separators, no leading dot (`..`), as in a topology file.
_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,126}")
# A reply must stay well inside gRPC's 64 MiB message limit (broker/server.py): the records of
# one reply are at most max_pull_bytes, plus one record that alone exceeds it.
MAX_PULL_BYTES_LIMIT = 48 << 20


def _host_port(key: str, value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key} must be host:port, not {value!r}", key=key)
    return value


def _check_shape(doc: object, source: str) -> dict[str, Any]:
    """A mapping of known keys that names every required one."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    unknown = sorted(set(doc) - _FIELDS.keys())
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}", key=unknown[0])
    for required in ("broker_set", "data_dir", "controllers"):
        if not doc.get(required):
            raise ConfigError(f"{source}: {required} is required", key=required)
    return doc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_type(name: str, value: Any, source: str) -> Any:
    """The value of one key, checked against the type of its default (priority: an int or None)."""
    default = _FIELDS[name].default
    if name == "data_dir":
        return Path(str(value))
    if name == "tls":
        return None if value is None else parse_section(value, source)
    if name in _PARSERS:
        return _PARSERS[name](name, value, source)
    if name == "priority":
        if value is not None and not _is_int(value):
            raise ConfigError(f"{source}: priority must be an integer", key=name)
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {name} must be true or false", key=name)
    elif isinstance(default, int):
        _check_int(name, value, source)
    elif not isinstance(value, str):
        raise ConfigError(f"{source}: {name} must be a string", key=name)
    return value


def _check_int(name: str, value: Any, source: str) -> None:
    if not _is_int(value):
        raise ConfigError(f"{source}: {name} must be an integer", key=name)
    if name in _POSITIVE and value <= 0:
        raise ConfigError(f"{source}: {name} must be positive", key=name)
    if name in _NON_NEGATIVE and value < 0:
        raise ConfigError(f"{source}: {name} must not be negative (0 turns it off)", key=name)


def _group_names(name: str, value: Any, source: str) -> tuple[str, ...]:
    """A list of consumer-group names (as the brokers accept them: 1-255 characters)."""
    if not isinstance(value, list | tuple) or not all(
        isinstance(g, str) and 0 < len(g) <= 255 for g in value
    ):
        raise ConfigError(f"{source}: {name} must be a list of consumer-group names", key=name)
    return tuple(value)


# An access key travels in `Credential=<key>, ...`: no separator of that header in it.
_ACCESS_KEY = re.compile(r"[A-Za-z0-9._@:+=-]{1,128}")


def _access_keys(name: str, value: Any, source: str) -> tuple[tuple[str, str], ...]:
    """A list of {access_key, secret_key}: access keys distinct, secrets non-empty."""
    shape = f"{name} must be a list of {{access_key: ..., secret_key: ...}}"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {shape}", key=name)
    out: list[tuple[str, str]] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) != {"access_key", "secret_key"}:
            raise ConfigError(f"{source}: {name}[{i}]: {shape}", key=f"{name}[{i}]")
        ak, sk = entry["access_key"], entry["secret_key"]
        if not isinstance(ak, str) or not _ACCESS_KEY.fullmatch(ak):
            raise ConfigError(
                f"{source}: {name}[{i}].access_key must be 1-128 letters, digits or ._@:+=-",
                key=f"{name}[{i}].access_key",
            )
        if not isinstance(sk, str) or not sk:
            raise ConfigError(
                f"{source}: {name}[{i}].secret_key must be a non-empty string", key=f"{name}[{i}].secret_key"
            )
        if any(ak == known for known, _ in out):
            raise ConfigError(f"{source}: {name}: access key {ak!r} is listed twice", key=f"{name}[{i}]")
        out.append((ak, sk))
    return tuple(out)


def _backoff(name: str, value: Any, source: str) -> tuple[int, ...]:
    """A non-empty list of delays in whole seconds (the clients read a delay's seconds only), each
    within an invisible duration's bound."""
    top = MAX_INVISIBLE_MS // 1000
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(_is_int(v) and 0 < v <= top for v in value)
    ):
        raise ConfigError(f"{source}: {name} must be a non-empty list of seconds in [1, {top}]", key=name)
    return tuple(value)


#: The keys whose value is a list, each with what checks it.
_LISTS = {
    "retention_respect_groups": _group_names,
    "rocketmq_access_keys": _access_keys,
    "rocketmq_retry_backoff_s": _backoff,
}
# whether TLS is on for `auth` is checked once every key is read (_check_limits)
_PARSERS: dict[str, Any] = {**_LISTS, "auth": lambda _name, value, source: parse_auth(value, source, True)}


def _check_value(name: str, value: Any, source: str) -> Any:
    value = _check_type(name, value, source)
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ConfigError(f"{source}: {name} must be one of {', '.join(_CHOICES[name])}", key=name)
    if name == "secret" and not value:
        raise ConfigError(f"{source}: secret must be a non-empty string", key=name)
    if name == "broker_set" and not _SET_NAME.fullmatch(value):
        raise ConfigError(
            f"{source}: broker_set {value!r} must be letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, at most 127)",
            key=name,
        )
    if name in ("listen", "ha_listen") or (name.endswith("_address") and value):
        _host_port(name, value)
    if name in ("data_listen", "rocketmq_listen") and value not in ("", "auto"):
        _host_port(name, value)
    return value


def _check_reachable(cfg: BrokerConfig, source: str) -> None:
    """A wildcard listen address needs an advertised one, and that one is never a wildcard."""
    for listen_key, adv_key in (("listen", "advertise_address"), ("ha_listen", "ha_advertise_address")):
        listen = getattr(cfg, listen_key)
        adv = getattr(cfg, adv_key)
        if listen.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::", "") and not adv:
            raise ConfigError(
                f"{source}: {listen_key} {listen} is a wildcard: set {adv_key} to the "
                f"host:port that clients and peers should connect to",
                key=adv_key,
            )
        if adv and adv.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::"):
            raise ConfigError(
                f"{source}: {adv_key} must be an address others can reach, not a wildcard", key=adv_key
            )


def _check_limits(cfg: BrokerConfig, source: str) -> None:
    if cfg.max_pull_bytes > MAX_PULL_BYTES_LIMIT:
        raise ConfigError(
            f"{source}: max_pull_bytes is at most {MAX_PULL_BYTES_LIMIT} (a reply must fit "
            f"in a gRPC message)",
            key="max_pull_bytes",
        )
    if cfg.metrics_address and cfg.metrics_address in (cfg.listen, cfg.ha_listen):
        raise ConfigError(
            f"{source}: metrics_address {cfg.metrics_address} is also the listen or ha_listen address",
            key="metrics_address",
        )
    if cfg.auth is not None and cfg.tls is None:
        # a signature covers only its date: without TLS anyone on the path could replay it
        raise ConfigError(
            f"{source}: auth needs TLS (a tls: section): signed calls in plain text can be replayed",
            key="auth",
        )
    if cfg.rocketmq_max_delivery_attempts > MAX_ATTEMPTS:
        raise ConfigError(
            f"{source}: rocketmq_max_delivery_attempts is at most {MAX_ATTEMPTS}",
            key="rocketmq_max_delivery_attempts",
        )
    if cfg.rocketmq_invisible_ms > MAX_INVISIBLE_MS:
        raise ConfigError(
            f"{source}: rocketmq_invisible_ms is at most {MAX_INVISIBLE_MS} (12 h)",
            key="rocketmq_invisible_ms",
        )
    if cfg.cq_max_open_files < MIN_CQ_OPEN_FILES:
        raise ConfigError(
            f"{source}: cq_max_open_files is at least {MIN_CQ_OPEN_FILES} (a consume queue reads "
            "through up to three at once)",
            key="cq_max_open_files",
        )
    if cfg.min_in_sync_replicas > cfg.in_sync_replicas:
        raise ConfigError(
            f"{source}: min_in_sync_replicas exceeds in_sync_replicas", key="min_in_sync_replicas"
        )


def from_mapping(doc: dict[str, Any], *, source: str = "config") -> BrokerConfig:
    values = {name: _check_value(name, value, source) for name, value in _check_shape(doc, source).items()}
    if not values.get("secret"):
        values["secret"] = secret_from_env()
    cfg = BrokerConfig(**values)
    _check_reachable(cfg, source)
    _check_limits(cfg, source)
    return cfg


def load(path: str | Path, overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
    """The config in the YAML file at `path`, with `overrides` (keys of the file, as the file would
    write them: `tide broker --data-dir ...`) put over the file's before it is checked."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read broker config {p}: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    doc = doc or {}
    if overrides and isinstance(doc, dict):
        doc = {**doc, **overrides}
    return from_mapping(doc, source=str(p))
