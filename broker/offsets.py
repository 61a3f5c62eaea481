"""Consumer-group offsets, stored as records of the commit log itself.

A commit is a record in the reserved topic `%OFFSETS%` (queue 0) whose body is JSON
`{"g": group, "t": topic, "q": queue, "o": offset}`. Being ordinary records, commits replicate to
slaves with everything else and survive a failover exactly as messages do: a commit is
acknowledged under the same replication rules, and readers (here: `fetch`) only apply confirmed
records. The latest value per (group, topic, queue) is folded into a dict on demand.

A commit of a topic made before the topic's latest generation marker (broker/topics.py) is a
commit of the deleted topic of that name, not of the current one: `fetch` ignores it, so the
group starts the new topic from its configured start instead of an old position.

Retention does not lose commits: before a segment holding the latest commit of a (group,
topic, queue) goes, the master appends a copy of it (broker/compaction.py).
"""

from __future__ import annotations

import json

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import OffsetBelowRetentionError

OFFSETS_TOPIC = "%OFFSETS%"
FLAG_CONSUMER_OFFSET = 1


def commit_message(group: str, topic: str, queue: int, offset: int) -> Message:
    body = json.dumps({"g": group, "t": topic, "q": queue, "o": offset}, separators=(",", ":")).encode()
    return Message(OFFSETS_TOPIC, 0, body, flags=FLAG_CONSUMER_OFFSET)


class GroupOffsets:
    def __init__(self, commitlog: CommitLog) -> None:
        self._log = commitlog
        # (group, topic, queue) -> (offset, physical offset of the commit record)
        self._offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
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
                doc = json.loads(m.body)
                self._offsets[(doc["g"], doc["t"], int(doc["q"]))] = (int(doc["o"]), m.phys_offset)
            self._applied = batch[-1].queue_offset + 1

    def fetch(self, group: str, topic: str, queue: int, *, since: int = -1) -> int | None:
        """The group's committed offset, if committed at or after the physical offset `since`
        (the topic's latest generation marker; -1: any)."""
        self._refresh()
        found = self._offsets.get((group, topic, queue))
        if found is None or found[1] < since:
            return None
        return found[0]

    def committed(self) -> dict[tuple[str, str, int], tuple[int, int]]:
        """Every confirmed commit: (group, topic, queue) -> (offset, physical offset of the commit)."""
        self._refresh()
        return dict(self._offsets)
