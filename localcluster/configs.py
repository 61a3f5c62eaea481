"""The YAML configs of local controllers and brokers: what each document holds, and writing it.

A config carries the cluster secret, so it is written readable by its owner only. The keys are
those of deploy/CONFIG.md; the settings passed in are written as given, after the required ones
(so a caller can override any of them, the secret excepted for brokers started by `up`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidelog.private import write_private


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    import yaml  # here, not at the top: only `up` writes configs of all that load this module

    write_private(path, yaml.safe_dump(doc))
    return path


def controller_doc(
    data_dir: Path, nodes: list[dict[str, str]], *, secret: str | None, **settings: Any
) -> dict[str, Any]:
    """One controller config for every node (`nodes`: id, raft, grpc); each node starts with `--node-id`."""
    doc: dict[str, Any] = {"data_dir": str(data_dir), "nodes": nodes, **settings}
    if secret:
        doc["secret"] = secret
    return doc


def broker_doc(
    broker_set: str,
    data_dir: Path,
    controllers: str,
    listen: str,
    ha_listen: str,
    *,
    secret: str | None,
    **settings: Any,
) -> dict[str, Any]:
    """The config of one broker replica of `broker_set`, registering with `controllers`."""
    doc: dict[str, Any] = {
        "broker_set": broker_set,
        "data_dir": str(data_dir),
        "controllers": controllers,
        "listen": listen,
        "ha_listen": ha_listen,
    }
    if secret:
        doc["secret"] = secret
    doc.update(settings)
    return doc
