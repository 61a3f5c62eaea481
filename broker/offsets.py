"""Consumer-group offsets, stored as records of the commit log itself.

A commit is a record in the reserved topic `%OFFSETS%` (queue 0) whose body is JSON
`{"g": group, "t": topic, "q": queue, "o": offset}`; a call of many commits (`CommitOffsets`) is
written as records whose body is a JSON array of such objects (`batch_messages`), one record per
up to `BATCH_BODY_BYTES` of them rather than one per commit: a record's costs (laying it out,
replicating it, reading it back to fold it, scrubbing it) were most of a batched commit's CPU. A
broker older than this format reads an array body as malformed and ignores it: upgrade slaves
before their master. Being ordinary records, commits replicate to
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

A restart does not read every commit again: the fold is checkpointed to
`<data_dir>/offsets-fold.checkpoint` (`save_checkpoint`: every `offsets_checkpoint_interval_ms`
and at a clean stop; atomically, 0600, fsync'ed, with a CRC), and after a start the fold takes it
and reads only what follows once the log is seen to hold the history it covers and the confirm
offset has reached it again (broker/offsetscheckpoint.py); a checkpoint that does not match is
ignored with a warning and the whole log folded as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterable

from tidelog.broker import offsetscheckpoint as ocp
from tidelog.broker.fold import TopicFold
from tidelog.commitlog import CommitLog, Message, StoredMessage
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.epochs import atomic_write
from tidelog.errors import TidelogError
from tidelog.tasks import within

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "offsets-fold.checkpoint"

OFFSETS_TOPIC = "%OFFSETS%"
FLAG_CONSUMER_OFFSET = 1
TOMBSTONE = -1  # the offset of a record that deletes the commit of its (group, topic, queue)

#: (group, topic, queue)
Key = tuple[str, str, int]


def _plain(name: str) -> bool:
    """Whether JSON writes `name` as it is: printable ASCII, no quote, no backslash."""
    return name.isascii() and name.isprintable() and '"' not in name and "\\" not in name


def commit_body(group: str, topic: str, queue: int, offset: int) -> bytes:
    """The JSON body of a commit, without the encoder where the names need no escape (the bytes
    are the same: the encoder was a sixth of a batched commit's CPU)."""
    if _plain(group) and _plain(topic) and type(queue) is int and type(offset) is int:
        return b'{"g":"%s","t":"%s","q":%d,"o":%d}' % (group.encode(), topic.encode(), queue, offset)
    return json.dumps({"g": group, "t": topic, "q": queue, "o": offset}, separators=(",", ":")).encode()


def commit_message(group: str, topic: str, queue: int, offset: int) -> Message:
    return Message(OFFSETS_TOPIC, 0, commit_body(group, topic, queue, offset), flags=FLAG_CONSUMER_OFFSET)


#: the most of commits' bodies one batch record holds: far below any `max_message_bytes` a
#: broker accepts, and a record a slave or a fold takes in one read
BATCH_BODY_BYTES = 64 * 1024


def batch_messages(
    commits: Iterable[tuple[str, str, int, int]], max_body: int = BATCH_BODY_BYTES
) -> list[Message]:
    """The records of many (group, topic, queue, offset) commits: JSON arrays of their bodies,
    each up to `max_body` bytes (a single commit as its own body)."""
    bodies: list[list[bytes]] = [[]]
    size = 1  # the closing bracket
    for commit in commits:
        body = commit_body(*commit)
        if bodies[-1] and size + len(body) + 1 > max_body:
            bodies.append([])
            size = 1
        bodies[-1].append(body)
        size += len(body) + 1  # with the bracket or comma before it
    return [
        Message(
            OFFSETS_TOPIC,
            0,
            one[0] if len(one) == 1 else b"[" + b",".join(one) + b"]",
            flags=FLAG_CONSUMER_OFFSET,
        )
        for one in bodies
        if one
    ]


def tombstone_message(group: str, topic: str, queue: int) -> Message:
    """The record that deletes the group's commit of (topic, queue)."""
    return commit_message(group, topic, queue, TOMBSTONE)


# The body as `commit_message` writes it, names free of quotes and escapes: read without the JSON
# decoder, which cost a restart's fold and every retention check 20 us a commit (80,000 live
# commits: 1.6 s). Anything else (escapes, spaces, other key orders) takes the decoder.
_STRING = rb'"([^"\\\x00-\x1f]*)"'  # no quote, escape or control character (JSON allows none raw)
_INT = rb"(-?(?:0|[1-9][0-9]*))"


def _commit_pattern(string: bytes, integer: bytes) -> bytes:
    return rb'\{"g":' + string + rb',"t":' + string + rb',"q":' + integer + rb',"o":' + integer + rb"\}"


_COMPACT = re.compile(_commit_pattern(_STRING, _INT))
# ... and a batch of such commits (`batch_messages`), checked whole (no groups: one scan takes them)
_ONE = _commit_pattern(_STRING.replace(b"(", b"(?:"), _INT.replace(b"(-", b"(?:-"))
_COMPACT_BATCH = re.compile(rb"\[" + _ONE + rb"(?:," + _ONE + rb")*\]")
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


def _decoded_batch(body: bytes) -> list[tuple[Key, int]]:
    try:
        docs = json.loads(body)
        if not isinstance(docs, list):
            return []
        return [((str(d["g"]), str(d["t"]), int(d["q"])), int(d["o"])) for d in docs]
    except (ValueError, KeyError, TypeError):
        return []


def parse_commits(body: bytes) -> list[tuple[Key, int]]:
    """Every ((group, topic, queue), offset) a record's body holds, in order: one for a commit's
    body, each of a batch's (`batch_messages`); none for a malformed body or a batch with a
    malformed commit, which every reader ignores whole (a call's commits are all or none)."""
    if body[:1] != b"[":
        one = parse_commit(body)
        return [] if one is None else [one]
    # as `parse_commit`: commits as `commit_body` writes them without the decoder, the whole body
    # checked by one match and its commits taken by one scan (both in C)
    if _COMPACT_BATCH.fullmatch(body) is None:
        return _decoded_batch(body)
    try:
        return [((g.decode(), t.decode(), int(q)), int(o)) for g, t, q, o in _COMPACT.findall(body)]
    except UnicodeDecodeError:
        return []  # not JSON either: JSON text is UTF-8


def is_tombstone(body: bytes) -> bool:
    if _NOT_TOMBSTONE_END.search(body):
        return False  # retention asks this of every live commit at every check
    parsed = parse_commit(body)
    return parsed is not None and parsed[1] < 0


def fold_commit(offsets: dict[Key, tuple[int, int]], body: bytes, phys_offset: int) -> list[tuple[Key, int]]:
    """Apply one confirmed record (at `phys_offset`) to the fold: (group, topic, queue) ->
    (offset, physical offset of the commit record), for each commit it holds. A tombstone removes
    the key. Returns the keys the fold gained (+1) or lost (-1)."""
    changed: list[tuple[Key, int]] = []
    for key, offset in parse_commits(body):
        if offset < 0:
            if offsets.pop(key, None) is not None:
                changed.append((key, -1))
            continue
        if key not in offsets:
            changed.append((key, 1))
        offsets[key] = (offset, phys_offset)
    return changed


class GroupOffsets:
    """The fold of the confirmed commits: (group, topic, queue) -> its latest commit.

    `checkpoint`: start from the fold's checkpoint in the log's directory when it can be trusted,
    and write it there on `save_checkpoint` (False: always fold the whole log, write nothing)."""

    def __init__(self, commitlog: CommitLog, *, checkpoint: bool = True) -> None:
        self.log = commitlog
        # (group, topic, queue) -> (offset, physical offset of the commit record)
        self._offsets: dict[Key, tuple[int, int]] = {}
        self._groups: dict[str, int] = {}  # group -> its keys in the fold (`max_groups`)
        self._last: ocp.LastRecord | None = None  # the last record folded in
        self._covers = 0  # where it ends
        # confirmed commits only: a commit is visible once confirmed (broker/fold.py folds again
        # after a truncation)
        self._fold = TopicFold(
            commitlog, OFFSETS_TOPIC, self._apply, self._clear, confirmed_only=True, batch=1024
        )
        self.path = os.path.join(commitlog.directory, CHECKPOINT_FILE) if checkpoint else None
        self._loaded = not checkpoint  # the checkpoint is read on the first refresh
        self._pending: ocp.FoldCheckpoint | None = None  # read, not yet taken
        self._saved_covers = -1  # what the file last written covers
        self._writing = threading.Lock()
        self.restored_from: int | None = None  # the offset a restart's fold started at, if it used one
        commitlog.truncate_listeners.append(self._on_truncate)

    def _apply(self, m: StoredMessage) -> None:
        for (group, _, _), delta in fold_commit(self._offsets, m.body, m.phys_offset):
            left = self._groups.get(group, 0) + delta
            if left:
                self._groups[group] = left
            else:
                del self._groups[group]
        self._last = ocp.LastRecord(m.phys_offset, m.epoch, crc32c(m.body))
        self._covers = m.phys_offset + m.size

    def _clear(self) -> None:
        self._offsets.clear()
        self._groups.clear()
        self._last = None
        self._covers = 0

    def _on_truncate(self, cut: int) -> None:
        # Records folded in are about to go (fork repair): fold again from the survivors. The
        # fold's own check sees a cut only until the log grows back past it, and a checkpoint
        # written from a fold that missed one would carry the lost commits into every restart.
        if cut < self._covers:
            self._fold.reset()
            self._saved_covers = -1

    def _refresh(self) -> None:
        if not self._loaded:
            self._loaded = True
            self._pending = self._read_checkpoint()
        if self._pending is not None:
            self._adopt(self._pending)
        self._fold.refresh()

    def _read_checkpoint(self) -> ocp.FoldCheckpoint | None:
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read %s (%s): folding every commit of the log", self.path, exc)
            return None
        cp = ocp.decode(data)
        if cp is None:
            log.warning("%s is not an intact checkpoint: ignored, folding every commit of the log", self.path)
        return cp

    def _adopt(self, cp: ocp.FoldCheckpoint) -> None:
        """Start from `cp` if the log holds its history and its commits are confirmed again here;
        keep it for a later refresh while only the confirm offset is short of it."""
        why = ocp.trust(cp, self._facts(cp))
        if why is not None:
            self._pending = None
            log.warning("%s no longer matches the log (%s): folding every commit of the log", self.path, why)
            return
        if not ocp.ready(cp, self.log.confirm_offset):
            return  # the fold goes on up to the confirm offset, short of the checkpoint's last record
        self._pending = None
        if self._fold.applied > cp.applied:
            return  # folded past it already
        # what was folded meanwhile is a prefix of what the checkpoint holds
        self._offsets.clear()
        self._offsets.update(ocp.restore(cp, self.log.min_offset))
        self._groups = collections.Counter(group for group, _, _ in self._offsets)
        self._last, self._covers = cp.last, cp.covers
        self._fold.applied = cp.applied
        self._saved_covers = cp.covers
        self.restored_from = cp.covers
        log.info(
            "group offsets: %d commits from %s, folding the log from offset %d on",
            len(self._offsets),
            self.path,
            cp.covers,
        )

    def _facts(self, cp: ocp.FoldCheckpoint) -> ocp.LogFacts:
        record: tuple[int, int, int] | None = None
        if cp.last is not None and self.log.min_offset <= cp.last.phys_offset < self.log.max_offset:
            with contextlib.suppress(TidelogError):  # not a record boundary any more, corrupt...
                m = self.log.read_at(cp.last.phys_offset)
                if m.topic == OFFSETS_TOPIC and m.queue_id == 0:
                    record = (m.queue_offset, m.epoch, crc32c(m.body))
        entry = self.log.epochs.find(cp.covers - 1) if cp.covers > 0 else None
        return ocp.LogFacts(
            max_offset=self.log.max_offset,
            confirm_offset=self.log.confirm_offset,
            min_offset=self.log.min_offset,
            epoch_at_covers=None if entry is None else (entry.epoch, entry.start),
            record_at_last=record,
        )

    def checkpoint_now(self) -> ocp.FoldCheckpoint | None:
        """The fold as it stands after a refresh, as a checkpoint; None when the file already
        covers as much (nothing to write)."""
        self._refresh()
        if self.path is None or self._covers == self._saved_covers:
            return None
        entry = self.log.epochs.find(self._covers - 1) if self._covers > 0 else None
        return ocp.FoldCheckpoint(
            applied=self._fold.applied,
            covers=self._covers,
            last=self._last,
            epoch=None if entry is None else (entry.epoch, entry.start),
            offsets=dict(self._offsets),
        )

    def write_checkpoint(self, cp: ocp.FoldCheckpoint) -> None:
        """Write `cp` (from `checkpoint_now`) to the file: blocking, so off the event loop when
        the fold is large (encoding 80,000 commits takes a tenth of a second)."""
        if self.path is None:
            return
        data = ocp.encode(cp)
        with self._writing:  # the loop's write on its thread and a stop's must not share the temp file
            atomic_write(self.path, data)  # 0600, fsync'ed, renamed into place
            self._saved_covers = cp.covers

    def save_checkpoint(self) -> bool:
        """Checkpoint the fold now, on this thread (a clean stop); False when nothing was new.
        A failure is logged: the next start folds more of the log, nothing is lost."""
        try:
            cp = self.checkpoint_now()
            if cp is None:
                return False
            self.write_checkpoint(cp)
            return True
        except (OSError, TidelogError) as exc:
            log.warning("cannot checkpoint the group offsets to %s: %s", self.path, exc)
            return False

    async def checkpoint_loop(self, stopping: asyncio.Event, interval_s: float) -> None:
        """Checkpoint the fold every `interval_s` until `stopping`: the state is taken on the
        event loop, encoded and written on a thread."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), interval_s)
            if stopping.is_set():
                return
            try:
                cp = self.checkpoint_now()
                if cp is not None:
                    await asyncio.to_thread(self.write_checkpoint, cp)
            except (OSError, TidelogError) as exc:
                log.warning("cannot checkpoint the group offsets to %s: %s", self.path, exc)

    def fetch(self, group: str, topic: str, queue: int, *, since: int = -1) -> int | None:
        """The group's committed offset, if committed at or after the physical offset `since`
        (the topic's latest generation marker; -1: any)."""
        self._refresh()
        found = self._offsets.get((group, topic, queue))
        if found is None or found[1] < since:
            return None
        return found[0]

    def new_groups(self, groups: Iterable[str]) -> tuple[set[str], int]:
        """Those of `groups` without a confirmed commit, and how many groups have one: the fold
        brought up to date once for a whole call of commits, not once per commit (a third of a
        batched commit's CPU was that refresh)."""
        self._refresh()
        return {g for g in groups if g not in self._groups}, len(self._groups)

    def committed(self) -> dict[Key, tuple[int, int]]:
        """Every confirmed commit: (group, topic, queue) -> (offset, physical offset of the commit)."""
        self._refresh()
        return dict(self._offsets)
