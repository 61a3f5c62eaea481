"""The controller state's snapshot codec: ``StateData`` to and from JSON-able plain data.

Raft stores the state as this plain data, not as pickled classes, so a snapshot survives
refactors of the state classes. Bytes are base64, sets are sorted lists, order is canonical.
Format 2 added the cluster id; format 1 snapshots are read, with none. Format 3 added users and
grants (format 1 and 2 snapshots are read, with none). Format 4 stores the metadata entries
(ledgers, mostly) as columns, their values as one base64 string: an entry per dict with its own
base64 value cost a restore of 1,000,000 ledgers 7.9 s, most of it in a million base64 calls
(earlier formats are read as before). Fields added later
(tombstones, generations, ``unclean_epoch``, ``modified_ms``, a topic's ``retention_ms``) read
with their defaults.

`pack` and `unpack` are how earlier versions stored that plain data inside PySyncObj's own
snapshot file (pickled, compressed at zlib level 1, under PySyncObj's level-9 gzip); such files
are still read (controller/snapshotfile.py).

`capture` and `parts` are how the Raft node's snapshot file is written off its thread
(controller/snapshotfile.py): `capture` copies references only (the small fields encoded), which
is consistent because topics and metadata entries are replaced, never changed in place; `parts`
encodes the capture in pieces of a bounded number of entries, so that the thread encoding them
holds the interpreter for milliseconds at a time, not seconds. `restore_parts` reads them back.
Parts keep the state's own order of entries (sorting a million keys is one call that would hold
the interpreter for a second); `encode` stays canonical.
"""

from __future__ import annotations

import base64
import itertools
import pickle
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.acl import Grant, User

from .model import BrokerSet, Member, MetaEntry, StateData, Topic

SNAPSHOT_FORMAT = 4  # 2: the cluster id; 3: users and grants; 4: metadata as columns


def encode(s: StateData) -> dict[str, Any]:
    """A JSON-able snapshot of ``s``."""
    return {
        **_head(s),
        "topics": [_topic_dict(t) for _, t in sorted(s.topics.items())],
        "deleted_topics": [_topic_dict(t) for _, t in sorted(s.deleted_topics.items())],
        "metadata": _metadata_columns([e for _, e in sorted(s.metadata.items())]),
    }


def _head(s: StateData) -> dict[str, Any]:
    """Every field but the three that grow (topics, deleted topics, metadata), encoded."""
    return {
        "format": SNAPSHOT_FORMAT,
        "broker_sets": [_broker_set_dict(bs) for _, bs in sorted(s.broker_sets.items())],
        "next_id_floor": dict(sorted(s.next_id_floor.items())),
        "cluster_id": s.cluster_id,
        "next_topic_generation": s.next_topic_generation,
        "users": [vars(u).copy() for _, u in sorted(s.users.items())],
        "grants": [vars(g).copy() for g in sorted(s.grants)],
        "acl_version": s.acl_version,
    }


@dataclass(frozen=True)
class Capture:
    """A state as it was at one log index: its small fields encoded, and references to its
    topics and metadata entries (immutable objects: a later command replaces them)."""

    head: dict[str, Any]
    topics: list[Topic]
    deleted_topics: list[Topic]
    metadata: list[MetaEntry]


def capture(s: StateData) -> Capture:
    """`s` now, at the cost of copying references (a million metadata entries: 18–25 ms in a
    controller, bench/RESULTS.md)."""
    return Capture(
        _head(s), list(s.topics.values()), list(s.deleted_topics.values()), list(s.metadata.values())
    )


def parts(c: Capture, size: int = 20_000) -> Iterator[dict[str, Any]]:
    """`c` as plain data in pieces: the head, then at most `size` entries per piece, encoded one
    piece at a time (metadata values as raw bytes: the pieces are pickled, not JSON)."""
    yield {"head": c.head}
    for field in ("topics", "deleted_topics"):
        topics: list[Topic] = getattr(c, field)
        for i in range(0, len(topics), size):
            yield {field: [_topic_dict(t) for t in topics[i : i + size]]}
    for i in range(0, len(c.metadata), size):
        yield {"metadata": _metadata_columns(c.metadata[i : i + size], raw=True)}


def restore_parts(s: StateData, pieces: Iterable[Mapping[str, Any]]) -> None:
    """Fill an empty ``s`` from `parts`' output; ValueError for what `parts` does not write."""
    it = iter(pieces)
    first = next(it, None)
    if first is None or not isinstance(first.get("head"), Mapping):
        raise ValueError("controller snapshot: the parts do not start with a head")
    restore(s, {**first["head"], "topics": (), "deleted_topics": (), "metadata": ()})
    for piece in it:
        if "topics" in piece:
            s.topics.update((t["name"], _topic_from(t)) for t in piece["topics"])
        elif "deleted_topics" in piece:
            s.deleted_topics.update((t["name"], _topic_from(t)) for t in piece["deleted_topics"])
        elif "metadata" in piece:
            s.metadata.update(_metadata_from_columns(piece["metadata"]))
        else:
            raise ValueError(f"controller snapshot: an unknown part {sorted(piece)!r:.80}")


def pack(doc: Mapping[str, Any]) -> bytes:
    """The bytes the Raft node stores for `encode`'s output."""
    return zlib.compress(pickle.dumps(dict(doc), protocol=5), 1)


def unpack(blob: bytes) -> dict[str, Any]:
    """`pack`'s input again; ValueError when `blob` is not a packed snapshot."""
    try:
        doc = pickle.loads(zlib.decompress(blob))
    except (zlib.error, pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"not a packed controller snapshot: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a packed controller snapshot: not a mapping")
    return doc


def restore(s: StateData, d: Mapping[str, Any]) -> None:
    """Fill an empty ``s`` from a snapshot; ValueError for a format this code cannot read."""
    if d.get("format") not in (1, 2, 3, SNAPSHOT_FORMAT):
        raise ValueError(f"unsupported controller snapshot format {d.get('format')!r}")
    for b in d["broker_sets"]:
        s.broker_sets[b["name"]] = _broker_set_from(b)
    s.next_id_floor = {str(k): int(v) for k, v in d.get("next_id_floor", {}).items()}
    s.cluster_id = str(d.get("cluster_id", ""))  # snapshots from before cluster ids have none
    for t in d["topics"]:
        s.topics[t["name"]] = _topic_from(t)
    # snapshots from before topic generations: their topics are generation 0
    s.next_topic_generation = int(d.get("next_topic_generation", 1))
    for t in d.get("deleted_topics", ()):
        s.deleted_topics[t["name"]] = _topic_from(t)
    meta = d["metadata"]
    if isinstance(meta, Mapping):
        s.metadata.update(_metadata_from_columns(meta))
    else:  # formats 1 to 3: an entry per dict
        for e in meta:
            s.metadata[e["key"]] = MetaEntry(
                key=e["key"],
                value=base64.b64decode(e["value"]),
                version=e["version"],
                modified_ms=e.get("modified_ms", 0),
            )
    for u in d.get("users", ()):
        s.users[u["name"]] = User(name=u["name"], access_key=u["access_key"], signing_key=u["signing_key"])
    s.grants = {Grant(g["user"], g["kind"], g["pattern"], g["permission"]) for g in d.get("grants", ())}
    s.acl_version = int(d.get("acl_version", 0))


def _metadata_columns(entries: list[MetaEntry], raw: bool = False) -> dict[str, Any]:
    """The entries as columns, their values joined: base64 text, or with `raw` the bytes."""
    values = b"".join(e.value for e in entries)
    return {
        "keys": [e.key for e in entries],
        "lengths": [len(e.value) for e in entries],
        "values": values if raw else base64.b64encode(values).decode("ascii"),
        "versions": [e.version for e in entries],
        "modified_ms": [e.modified_ms for e in entries],
    }


def _metadata_from_columns(c: Mapping[str, Any]) -> dict[str, MetaEntry]:
    keys, lengths, versions, modified = c["keys"], c["lengths"], c["versions"], c["modified_ms"]
    values = c["values"] if isinstance(c["values"], bytes) else base64.b64decode(c["values"])
    if not len(keys) == len(lengths) == len(versions) == len(modified) or sum(lengths) != len(values):
        raise ValueError("controller snapshot: the metadata columns do not agree")
    ends = list(itertools.accumulate(lengths))
    return {
        k: MetaEntry(k, values[end - n : end], v, m)
        for k, n, end, v, m in zip(keys, lengths, ends, versions, modified, strict=True)
    }


def _broker_set_dict(bs: BrokerSet) -> dict[str, Any]:
    return {
        "name": bs.name,
        "next_broker_id": bs.next_broker_id,
        "master_id": bs.master_id,
        "master_epoch": bs.master_epoch,
        "sync_state_set": sorted(bs.sync_state_set),
        "sss_epoch": bs.sss_epoch,
        "unclean_epoch": bs.unclean_epoch,
        "members": [vars(bs.members[i]).copy() for i in sorted(bs.members)],
    }


def _broker_set_from(b: Mapping[str, Any]) -> BrokerSet:
    members = {m["broker_id"]: Member(**m) for m in b["members"]}
    return BrokerSet(
        name=b["name"],
        members=members,
        next_broker_id=b["next_broker_id"],
        master_id=b["master_id"],
        master_epoch=b["master_epoch"],
        sync_state_set=frozenset(b["sync_state_set"]),
        sss_epoch=b["sss_epoch"],
        unclean_epoch=b.get("unclean_epoch", 0),
    )


def _topic_dict(t: Topic) -> dict[str, Any]:
    return {
        "name": t.name,
        "queues": dict(sorted(t.queues.items())),
        "perm": t.perm,
        "created_ms": t.created_ms,
        "generation": t.generation,
        "deleted_ms": t.deleted_ms,
        "retention_ms": t.retention_ms,
    }


def _topic_from(d: Mapping[str, Any]) -> Topic:
    return Topic(
        name=d["name"],
        queues=dict(d["queues"]),
        perm=d["perm"],
        created_ms=d.get("created_ms", 0),
        generation=d.get("generation", 0),
        deleted_ms=d.get("deleted_ms", 0),
        retention_ms=d.get("retention_ms", 0),
    )
