"""The topics one broker serves, and the generation markers that drop a deleted topic's data.

Theory of operation (broker/TOPICS.md has the reasoning)
--------------------------------------------------------
The controller gives every topic a *generation* when it is created (a counter that only grows)
and keeps a *tombstone* for a deleted one. Each heartbeat reply carries both for this broker
set; `TopicTable.update` keeps them.

A broker set's log says which generation of a topic its consume queues hold through *marker*
records in the reserved topic `%TOPIC%` (queue 0): `{"t": topic, "g": generation, "cut":
{queue: offset}}`, written by the master only. A marker means: from here on the topic is
generation `g`; every queue offset of it below `cut[queue]` belongs to an older generation and is
never readable again. `cut` is the master's next queue offset of each queue when it writes the
marker, so every record of the topic before the marker is below it and every one after is not.
That makes applying a marker order-insensitive: any replica, at any time after it holds the
marker, cuts its consume queues at those offsets (`CommitLog.cut_queue`) and gets the same index
as the master. Queue offsets continue across generations (a new topic starts where the old one
ended), so a consumer's stale position or commit lands below the new topic's start, never inside
its data.

- The master writes a marker when the controller's generation of a topic is newer than its log's
  (after the heartbeat that tells it, and before it serves any request for the topic), and when
  a tombstone names a topic whose queues here still hold readable data.
- Every replica folds the markers (`TopicMarks`), lazily: before it serves any request for a
  topic, after each heartbeat, and from the start at start-up (so cuts hold after a restart,
  also when a crash lost a consume-queue file change).
- A replica serves a topic only once its log's generation has reached the controller's. A slave
  that has not received the marker yet answers UNAVAILABLE (retryable); the master writes it.
- Fork repair can truncate a marker away. The queues it cut then no longer have a known start:
  they are dropped whole before the truncation (`CommitLog.drop_queues`) and start again with
  the next record the new master sends, and the fold is redone from the surviving markers. The
  new master writes its own marker before serving the topic (the controller's generation is at
  least the truncated marker's), and this replica serves the topic only after receiving it.

Group commits of a topic made before its latest marker belong to an older generation:
`GroupOffsets.fetch` ignores them. Retention carries the latest marker of each topic forward
before its segment goes (broker/compaction.py); the copy names the original's position (`at`),
which is what `marked_at` answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidelog.broker.fold import TopicFold
from tidelog.commitlog import CommitLog, Message, Placement, StoredMessage
from tidelog.commitlog.consumequeue import user_topic_problem
from tidelog.errors import (
    InvalidArgumentError,
    TopicGenerationPendingError,
    TopicNotFoundError,
)

log = logging.getLogger(__name__)

MARKS_TOPIC = "%TOPIC%"
FLAG_TOPIC_MARK = 4

__all__ = [
    "FLAG_TOPIC_MARK",
    "MARKS_TOPIC",
    "Mark",
    "TopicMarks",
    "TopicTable",
    "decode_mark",
    "mark_message",
]

#: (topic, generation, cut per queue id)
Mark = tuple[str, int, dict[int, int]]


def mark_message(topic: str, generation: int, cuts: Mapping[int, int]) -> Message:
    body = json.dumps(
        {"t": topic, "g": generation, "cut": {str(q): n for q, n in sorted(cuts.items())}},
        separators=(",", ":"),
    ).encode()
    return Message(MARKS_TOPIC, 0, body, flags=FLAG_TOPIC_MARK)


def decode_mark(body: bytes) -> Mark:
    """A marker's (topic, generation, cuts); ValueError for anything else."""
    try:
        doc = json.loads(body)
        topic, generation = doc["t"], doc["g"]
        cuts = {int(q): n for q, n in doc["cut"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a topic marker: {exc}") from None
    if (
        not isinstance(topic, str)
        or type(generation) is not int
        or generation < 0
        or not all(type(n) is int and n >= 0 for n in cuts.values())
    ):
        raise ValueError("not a topic marker: bad field types")
    return topic, generation, cuts


def _origin(m: StoredMessage) -> int:
    """Where a marker was first written: retention's copy of a marker (broker/compaction.py) names
    the original's position in `at`, so the commits made between the two still count."""
    try:
        at = json.loads(m.body).get("at")
    except (ValueError, AttributeError):
        return m.phys_offset
    return at if type(at) is int and 0 <= at <= m.phys_offset else m.phys_offset


class TopicMarks:
    """This replica's fold of the markers in its log: each topic's generation here, its latest
    marker's position, and the cuts, applied to the consume queues."""

    def __init__(self, commitlog: CommitLog) -> None:
        self.log = commitlog
        self._generation: dict[str, int] = {}
        self._marked_at: dict[str, int] = {}  # physical offset of each topic's latest marker
        self._fold = TopicFold(commitlog, MARKS_TOPIC, self._apply, self._forget)
        self.changes = 0  # moves whenever the fold changes (a marker folded in, a truncation)
        commitlog.truncate_listeners.append(self._on_truncate)
        self.refresh()

    def generation(self, topic: str) -> int:
        """The topic's generation in this log (0: no marker, a topic older than generations)."""
        return self._generation.get(topic, 0)

    def marked_at(self, topic: str) -> int:
        """Where the topic's latest marker is in the log (-1: none)."""
        return self._marked_at.get(topic, -1)

    def refresh(self) -> None:
        """Fold in (and apply) every marker appended since the last call."""
        # (retention that removed old markers removed every record they cut, too)
        self.changes += self._fold.refresh()

    def _apply(self, m: StoredMessage) -> None:
        try:
            topic, generation, cuts = decode_mark(m.body)
            for queue, offset in sorted(cuts.items()):
                self.log.cut_queue(topic, queue, offset)
        except (ValueError, InvalidArgumentError) as exc:
            log.error(
                "ignoring a malformed topic marker at offset %d of %s: %s",
                m.phys_offset,
                self.log.directory,
                exc,
            )
            return
        self._generation[topic] = max(self._generation.get(topic, 0), generation)
        self._marked_at[topic] = _origin(m)

    def _on_truncate(self, cut: int) -> None:
        self.refresh()  # markers not folded yet may be among those about to go
        for topic in sorted(t for t, at in self._marked_at.items() if at >= cut):
            # the marker that cut these queues goes: where they start is no longer known
            self.log.drop_queues(topic)
        self._fold.reset()  # folded again from the surviving markers
        self.changes += 1

    def _forget(self) -> None:
        self._generation.clear()
        self._marked_at.clear()


class TopicTable:
    """The topics this broker serves (from the controller) and its log's generations of them."""

    def __init__(self, commitlog: CommitLog) -> None:
        self.log = commitlog
        self.marks = TopicMarks(commitlog)
        self.queues: dict[str, int] = {}  # topic -> queues in this broker set
        self.generations: dict[str, int] = {}  # topic -> the controller's generation
        self.deleted: dict[str, int] = {}  # deleted topic -> its last generation
        # topic -> its own retention_ms (0: this broker's); broker/retention.py applies it
        self.retention: dict[str, int] = {}
        self.broker_set = ""
        self._updates = 0  # moves with every adopted controller view
        # (view, marks, epoch) as of the last `enforce` pass that found everything in place: with many
        # topics a pass costs a sort of all of them, and nothing has changed until one of these moves
        self._enforced: tuple[int, int, int] | None = None

    def update(self, broker_set: str, topics: Iterable[Any], deleted: Iterable[Any] = ()) -> None:
        """Adopt a heartbeat reply's topics and tombstones (controller TopicConfig messages)."""
        topics = list(topics)
        self.broker_set = broker_set
        self.queues = {t.name: int(t.queues.get(broker_set, 0)) for t in topics}
        self.generations = {t.name: int(t.generation) for t in topics}
        self.deleted = {t.name: int(t.generation) for t in deleted}
        # a topic record without the field (duck-typed stand-ins) means the broker's retention
        self.retention = {t.name: int(getattr(t, "retention_ms", 0)) for t in topics}
        self._updates += 1

    def serve(self, topic: str, append: Callable[[Message], Placement] | None) -> int:
        """The queues of `topic` here, once this replica's log holds its current generation.

        `append` appends a record as master (None on a slave): the master writes the marker
        itself; a slave that has not received it yet answers TopicGenerationPendingError."""
        problem = user_topic_problem(topic)
        if problem is not None:
            raise InvalidArgumentError(problem)
        queues = self.queues.get(topic)
        if not queues:
            raise TopicNotFoundError(
                f"topic {topic!r} has no queues in broker set {self.broker_set}",
                hint="create it with `tide topic create`, then retry",
            )
        want = self.generations.get(topic, 0)
        self.marks.refresh()
        if self.marks.generation(topic) < want:
            if append is None:
                raise TopicGenerationPendingError(
                    f"this replica has not yet received the master's marker for generation {want} "
                    f"of topic {topic!r} (it has {self.marks.generation(topic)}): a topic just "
                    f"created, or made again after a deletion"
                )
            self._mark(topic, want, append)
        return queues

    def enforce(self, append: Callable[[Message], Placement], epoch: int = 0) -> None:
        """As master of `epoch`: write the markers the controller's view asks for (newer
        generations, and tombstones of topics whose queues here still hold readable data)."""
        self.marks.refresh()
        # Within one mastership only a new view or a marker can make a pass find work (a deleted
        # topic takes no writes); a promotion may bring a log copied meanwhile, so it counts too.
        if self._enforced == (self._updates, self.marks.changes, epoch):
            return
        for topic, want in sorted(self.generations.items()):
            if self.marks.generation(topic) < want:
                self._mark(topic, want, append)
        if self.deleted:
            readable = set()
            for topic, queue in self.log.queues():
                if topic in self.deleted and topic not in readable:
                    offsets = self.log.queue_offsets(topic, queue)
                    if offsets.min < offsets.max:
                        readable.add(topic)
            for topic in sorted(readable):
                generation = self.deleted[topic]
                if self.marks.generation(topic) <= generation:
                    self._mark(topic, generation, append)
        # everything asked for is in place (a failed append raised before this line: next time
        # the pass runs again); the markers this pass wrote moved marks.changes already
        self._enforced = (self._updates, self.marks.changes, epoch)

    def _mark(self, topic: str, generation: int, append: Callable[[Message], Placement]) -> None:
        cuts = {}
        dropping = False
        for t, q in self.log.queues():
            if t == topic:
                offsets = self.log.queue_offsets(t, q)
                cuts[q] = offsets.max
                dropping = dropping or offsets.min < offsets.max
        placed = append(mark_message(topic, generation, cuts))
        self.marks.refresh()  # applies the cuts here at once
        log.log(
            logging.WARNING if dropping else logging.INFO,
            "topic %s is generation %d from offset %d of %s%s",
            topic,
            generation,
            placed.phys_offset,
            self.log.directory,
            f": the queue offsets below {cuts} of earlier generations are dropped" if dropping else "",
        )
