"""Compaction for retention: which metadata records in the log are still live, and their copies.

Theory of operation (docs/ARCHITECTURE.md §6.4)
------------------------------------------------
The commit log holds state besides messages: group-offset commits (`broker/offsets.py`),
shared-mode states (`broker/shared.py`), topic generation markers (`broker/TOPICS.md`) and
ledger records (`ledger/store.py`). A replica
rebuilding its indexes folds them from the log, so retention must not delete the last word on
any of them:

- **Group offsets, shared-mode states, topic markers** are *carried forward*: the latest
  *confirmed* record per key ((group, topic, queue); topic; a shared-mode state is carried as one
  whole-state record of its confirmed fold, which replaces its last whole state and the
  acknowledgements after it) that lies in a segment about to go is appended again, by the
  master, at the end of the log. The original stays until the copy is confirmed (a later round
  sees the original superseded), so a failover never leaves a replica with neither. A key that
  has a newer record not yet confirmed is not copied (the copy would land after it and undo it);
  its confirmed record keeps its segment until the newer one is confirmed.
  A commit (or shared-mode state) made before its topic's latest marker belongs to a deleted
  topic: dead, never copied.
  A tombstone (a deleted group's offsets, `broker/offsets.py`) is the latest record of its key
  but never live: it is not copied and holds no floor, since every commit it hides is older and
  goes with it (segments go oldest first).
  A marker's copy carries `at`, the original's position, so commits between the original and
  the copy still count as made after the marker (`broker/topics.py`).
- **Ledgers** are never copied: every segment from a ledger's CREATE record on stays while the
  ledger exists in the controller's metadata; its user frees the space by deleting it.

`carry_plan` is the decision (pure); `MetadataFold` reads the log incrementally.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from tidelog.broker.offsets import (
    FLAG_CONSUMER_OFFSET,
    OFFSETS_TOPIC,
    commit_body,
    is_tombstone,
    parse_commits,
)
from tidelog.broker.shared import FLAG_SHARED, SHARED_TOPIC, SharedStates
from tidelog.broker.topics import FLAG_TOPIC_MARK, MARKS_TOPIC
from tidelog.commitlog import CommitLog, Message, StoredMessage
from tidelog.errors import OffsetBelowRetentionError

log = logging.getLogger(__name__)

__all__ = ["CarryPlan", "Live", "MetadataFold", "carry_plan", "copy_message"]

#: ("offsets", group, topic, queue) or ("topic", topic)
Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Live:
    """The latest confirmed record of one key: where it is and its body."""

    key: Key
    offset: int
    body: bytes


@dataclass(frozen=True, slots=True)
class CarryPlan:
    """Copy `carry` to the end of the log (master only); keep every byte from `floor` on."""

    carry: list[Live] = field(default_factory=list)
    floor: int | None = None


def carry_plan(
    live: Iterable[Live],
    pending: AbstractSet[Key],
    limit: int,
    ledger_starts: Mapping[int, int],
    dead_ledgers: AbstractSet[int],
) -> CarryPlan:
    """What retention must do before deleting every segment below `limit`.

    `live`: the latest confirmed record per key; `pending`: keys with a newer record not yet
    confirmed; `ledger_starts`: each ledger's CREATE offset; `dead_ledgers`: those the
    controller no longer has (any other ledger counts as existing). Every live record below
    `limit` holds the floor (it goes only once superseded by a confirmed copy); those whose key
    has nothing pending are copied now."""
    floor: int | None = None
    carry = []
    for rec in live:
        if rec.offset >= limit:
            continue
        floor = rec.offset if floor is None else min(floor, rec.offset)
        if rec.key not in pending:
            carry.append(rec)
    for ledger_id, start in ledger_starts.items():
        if start < limit and ledger_id not in dead_ledgers:
            floor = start if floor is None else min(floor, start)
    carry.sort(key=lambda r: r.offset)
    return CarryPlan(carry, floor)


def copy_message(rec: Live) -> Message:
    """The record that carries `rec` forward."""
    if rec.key[0] == "topic":
        doc = json.loads(rec.body)
        doc.setdefault("at", rec.offset)  # a copy of a copy keeps the original's position
        body = json.dumps(doc, separators=(",", ":")).encode()
        return Message(MARKS_TOPIC, 0, body, flags=FLAG_TOPIC_MARK)
    if rec.key[0] == "shared":
        return Message(SHARED_TOPIC, 0, rec.body, flags=FLAG_SHARED)
    return Message(OFFSETS_TOPIC, 0, rec.body, flags=FLAG_CONSUMER_OFFSET)


def _keys(topic: str, body: bytes) -> list[tuple[Key, bytes]]:
    """The keys a record's body speaks for, each with the body that says it alone: a batch of
    commits is one record of many keys, and its live commits are carried one by one (copying
    the whole batch would bring back its superseded commits)."""
    if topic == OFFSETS_TOPIC:  # the commit's own reader: most bodies without the JSON decoder
        commits = parse_commits(body)
        if len(commits) == 1 and body[:1] != b"[":
            (group, t, queue), _ = commits[0]
            return [(("offsets", group, t, str(queue)), body)]
        return [(("offsets", g, t, str(q)), commit_body(g, t, q, o)) for (g, t, q), o in commits]
    try:
        doc = json.loads(body)
        if topic == SHARED_TOPIC:
            return [(("shared", str(doc["g"]), str(doc["t"]), str(int(doc["q"]))), body)]
        return [(("topic", str(doc["t"])), body)]
    except (ValueError, KeyError, TypeError):
        return []  # malformed: its reader ignores it too


class _TopicFold:
    """The latest confirmed record per key of one internal topic (queue 0), folded incrementally."""

    def __init__(self, commitlog: CommitLog, topic: str) -> None:
        self.log = commitlog
        self.topic = topic
        self.latest: dict[Key, Live] = {}
        self.applied = 0  # next queue offset to fold in

    def reset(self) -> None:
        self.latest.clear()
        self.applied = 0

    def _read(self, start: int, confirmed_only: bool) -> tuple[list[StoredMessage], int]:
        while True:
            try:
                return self.log.read(self.topic, 0, start, 1024, confirmed_only=confirmed_only), start
            except OffsetBelowRetentionError as exc:
                start = max(exc.min_offset, start + 1)

    def refresh(self) -> None:
        if self.log.queue_offsets(self.topic, 0).max < self.applied:
            self.reset()  # truncated below what was folded
        while True:
            batch, self.applied = self._read(self.applied, True)
            if not batch:
                return
            for m in batch:
                for key, body in _keys(self.topic, m.body):
                    self.latest[key] = Live(key, m.phys_offset, body)
            self.applied = batch[-1].queue_offset + 1

    def pending(self) -> set[Key]:
        """Keys with a record not yet confirmed."""
        keys: set[Key] = set()
        start = self.applied
        while True:
            batch, start = self._read(start, False)
            if not batch:
                return keys
            keys.update(key for m in batch for key, _ in _keys(self.topic, m.body))
            start = batch[-1].queue_offset + 1


class MetadataFold:
    """The live group commits and topic markers of one replica's log."""

    def __init__(self, commitlog: CommitLog) -> None:
        self._offsets = _TopicFold(commitlog, OFFSETS_TOPIC)
        self._marks = _TopicFold(commitlog, MARKS_TOPIC)
        self._shared = SharedStates(commitlog, confirmed_only=True)
        commitlog.truncate_listeners.append(self._on_truncate)

    def _on_truncate(self, _cut: int) -> None:
        self._offsets.reset()
        self._marks.reset()
        self._shared.reset()

    def refresh(self) -> tuple[list[Live], set[Key]]:
        """(live records, keys with a pending record). Commits made before their topic's latest
        marker are dead (`GroupOffsets.fetch` ignores them) and left out, and so are tombstones."""
        self._offsets.refresh()
        self._marks.refresh()
        marked_at = {}
        for key, rec in self._marks.latest.items():
            try:
                marked_at[key[1]] = int(json.loads(rec.body).get("at", rec.offset))
            except (ValueError, TypeError, AttributeError):
                marked_at[key[1]] = rec.offset
        live = list(self._marks.latest.values())
        live += [
            r
            for r in self._offsets.latest.values()
            if r.offset >= marked_at.get(r.key[2], -1) and not is_tombstone(r.body)
        ]
        live += [
            Live(("shared", g, t, str(q)), at, body)
            for (g, t, q), at, body in self._shared.whole()
            if at >= marked_at.get(t, -1)
        ]
        return live, self._offsets.pending() | self._marks.pending() | self._shared.pending()
