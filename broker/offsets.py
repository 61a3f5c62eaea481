"""Consumer-group offsets, stored as records of the commit log itself.

A commit is a record in the reserved topic `%OFFSETS%` (queue 0) whose body is JSON
`{"g": group, "t": topic, "q": queue, "o": offset}`. Being ordinary records, commits replicate to
slaves with everything else and survive a failover exactly as messages do: a commit is
acknowledged under the same replication rules, and readers (here: `fetch`) only apply confirmed
records. The latest value per (group, topic, queue) is folded into a dict on demand.

Deleting a group's offsets (`tide group delete`) is a record too, so that it replicates and
survives a failover like a commit: a **tombstone**, the same body with `"o": -1` (a commit is
never negative: `Replica.commit_offset` refuses it). The fold (`fold_commit`) treats it as "no
commit", and compaction never carries it forward: the commits it hides are older, so they lie
in the same or earlier segments and go with it.

A commit of a topic made before the topic's latest generation marker (broker/topics.py) is a
commit of the deleted topic of that name, not of the current one: `fetch` ignores it, so the
group starts the new topic from its configured start instead of an old position.

Retention does not lose commits: before a segment holding the latest commit of a (group,
topic, queue) goes, the master appends a copy of it (broker/compaction.py).
"""

from __future__ import annotations

import json
import re

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import OffsetBelowRetentionError

OFFSETS_TOPIC = "%OFFSETS%"
FLAG_CONSUMER_OFFSET = 1
TOMBSTONE = -1  # the offset of a record that deletes the commit of its (group, topic, queue)

#: (group, topic, queue)
Key = tuple[str, str, int]


def commit_message(group: str, topic: str, queue: int, offset: int) -> Message:
    body = json.dumps({"g": group, "t": topic, "q": queue, "o": offset}, separators=(",", ":")).encode()
    return Message(OFFSETS_TOPIC, 0, body, flags=FLAG_CONSUMER_OFFSET)


def tombstone_message(group: str, topic: str, queue: int) -> Message:
    """The record that deletes the group's commit of (topic, queue)."""
    return commit_message(group, topic, queue, TOMBSTONE)


# The body as `commit_message` writes it, names free of quotes and escapes: read without the JSON
# decoder, which cost a restart's fold and every retention check 20 us a commit (80,000 live
# commits: 1.6 s). Anything else (escapes, spaces, other key orders) takes the decoder.
_STRING = rb'"([^"\\\x00-\x1f]*)"'  # no quote, escape or control character (JSON allows none raw)
_INT = rb"(-?(?:0|[1-9][0-9]*))"
_COMPACT = re.compile(
    rb'\{"g":' + _STRING + rb',"t":' + _STRING + rb',"q":' + _INT + rb',"o":' + _INT + rb"\}"
)
# ... and the end of a commit that is not a tombstone: whatever precedes it, its last "o" (the one
# a JSON decoder keeps) is not negative, or the body is not JSON at all
_NOT_TOMBSTONE_END = re.compile(rb',"o":[0-9]+\}\Z')


def parse_commit(body: bytes) -> tuple[Key, int] | None:
    """((group, topic, queue), offset) of a commit record's body (TOMBSTONE: a delete), or None
    for a malformed body, which every reader ignores."""
    m = _COMPACT.fullmatch(body)
    if m is not None:
        try:
            return (m[1].decode(), m[2].decode(), int(m[3])), int(m[4])
        except UnicodeDecodeError:
            return None  # not JSON either: JSON text is UTF-8
    try:
        doc = json.loads(body)
        return (str(doc["g"]), str(doc["t"]), int(doc["q"])), int(doc["o"])
    except (ValueError, KeyError, TypeError):
        return None


def is_tombstone(body: bytes) -> bool:
    if _NOT_TOMBSTONE_END.search(body):
        return False  # retention asks this of every live commit at every check
    parsed = parse_commit(body)
    return parsed is not None and parsed[1] < 0


def fold_commit(offsets: dict[Key, tuple[int, int]], body: bytes, phys_offset: int) -> None:
    """Apply one confirmed record (at `phys_offset`) to the fold: (group, topic, queue) ->
    (offset, physical offset of the commit). A tombstone removes the key."""
    parsed = parse_commit(body)
    if parsed is None:
        return
    key, offset = parsed
    if offset < 0:
        offsets.pop(key, None)
    else:
        offsets[key] = (offset, phys_offset)


class GroupOffsets:
    def __init__(self, commitlog: CommitLog) -> None:
        self._log = commitlog
        # (group, topic, queue) -> (offset, physical offset of the commit record)
        self._offsets: dict[Key, tuple[int, int]] = {}
        self._applied = 0  # next queue offset of %OFFSETS%/0 to fold in

    def _refresh(self) -> None:
        offsets = self._log.queue_offsets(OFFSETS_TOPIC, 0)
        if offsets.max < self._applied:  # the log was truncated (fork repair): fold again
            self._offsets.clear()
            self._applied = 0
        while self._applied < offsets.confirmed:
            try:
                batch = self._log.read(OFFSETS_TOPIC, 0, self._applied, 1024)
            except OffsetBelowRetentionError as exc:
                self._applied = exc.min_offset
                continue
            if not batch:
                break
            for m in batch:
                fold_commit(self._offsets, m.body, m.phys_offset)
            self._applied = batch[-1].queue_offset + 1

    def fetch(self, group: str, topic: str, queue: int, *, since: int = -1) -> int | None:
        """The group's committed offset, if committed at or after the physical offset `since`
        (the topic's latest generation marker; -1: any)."""
        self._refresh()
        found = self._offsets.get((group, topic, queue))
        if found is None or found[1] < since:
            return None
        return found[0]

    def committed(self) -> dict[Key, tuple[int, int]]:
        """Every confirmed commit: (group, topic, queue) -> (offset, physical offset of the commit)."""
        self._refresh()
        return dict(self._offsets)
