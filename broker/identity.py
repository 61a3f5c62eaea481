"""The identity file that binds a broker's data directory to its controller-assigned id.

A new data directory gets a random identity token and registers as a new broker (the controller
assigns a fresh id, never reused). The id is stored next to the data, so a restart comes back
under the same id; a wiped directory has no identity file and so can never come back under the
old id pretending to hold that broker's data.

Like BookKeeper's cookie, the file names the cluster too (its id, learnt at the first
registration): a data directory written by another cluster (a swapped disk) is refused by the
controller (CLUSTER_MISMATCH) instead of joining as if it held this cluster's data.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from tidelog.commitlog.epochs import atomic_write
from tidelog.errors import ConfigError
from tidelog.private import private_dir

FILE_NAME = "identity.json"


@dataclass(frozen=True)
class Identity:
    broker_set: str
    token: str
    broker_id: int | None
    cluster_id: str = ""  # "" until the first registration answers


def load_or_create(data_dir: Path, broker_set: str) -> Identity:
    path = data_dir / FILE_NAME
    private_dir(data_dir)
    if path.exists():
        try:
            doc = json.loads(path.read_text())
            ident = Identity(
                doc["broker_set"], doc["token"], doc.get("broker_id"), str(doc.get("cluster_id", ""))
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path} is damaged ({exc}); a broker cannot guess its identity") from exc
        if ident.broker_set != broker_set:
            raise ConfigError(
                f"{data_dir} belongs to broker set {ident.broker_set!r}, not {broker_set!r}", key="broker_set"
            )
        return ident
    if (data_dir / "commitlog").exists():
        raise ConfigError(
            f"{data_dir} holds a commit log but no {FILE_NAME}; refusing to register it as a new broker",
            hint="restore the identity file or wipe the directory",
        )
    ident = Identity(broker_set, uuid.uuid4().hex, None)
    save(data_dir, ident)
    return ident


def save(data_dir: Path, ident: Identity) -> None:
    doc = {
        "broker_set": ident.broker_set,
        "token": ident.token,
        "broker_id": ident.broker_id,
        "cluster_id": ident.cluster_id,
    }
    atomic_write(os.fspath(data_dir / FILE_NAME), json.dumps(doc).encode())
