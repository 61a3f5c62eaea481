"""The one way the broker rebuilds state from an internal topic: a fold of its queue 0.

Owns "read what was appended since the last call, once each, in order; when the log was truncated
below what was folded (fork repair cut records this broker had folded), start again from the
first record". Shared subscriptions (broker/shared.py), the RocketMQ transactions and delays
(broker/rocketmqtx.py), group offsets (broker/offsets.py) and topic markers (broker/topics.py)
each fold their topic with it and say only what one record does to their state.
"""

from __future__ import annotations

from collections.abc import Callable

from tidelog.commitlog import CommitLog, StoredMessage


class TopicFold:
    """Folds queue 0 of `topic` into the caller's state: `apply` takes each record once, in order;
    `clear` empties the state before a fold starts again. `confirmed_only`: up to the confirm
    offset (what retention carries forward, what a commit makes visible); else to the end of the
    local log (a master's log is its set's history, confirmed or not)."""

    def __init__(
        self,
        commitlog: CommitLog,
        topic: str,
        apply: Callable[[StoredMessage], None],
        clear: Callable[[], None],
        *,
        confirmed_only: bool = False,
        batch: int = 256,
    ) -> None:
        self.log = commitlog
        self.topic = topic
        self._apply = apply
        self._clear = clear
        self._confirmed_only = confirmed_only
        self._batch = batch
        self.applied = 0  # the next queue offset of the topic to fold in

    def reset(self) -> None:
        """Forget the state: the next refresh folds from the first record again."""
        self._clear()
        self.applied = 0

    def refresh(self) -> int:
        """Fold in every record appended since the last call; how many were folded in."""
        if self.log.queue_offsets(self.topic, 0).max < self.applied:
            self.reset()  # the log was truncated below what was folded: fold again
        folded = 0
        tail = self.log.tail(self.topic, 0, self.applied, self._batch, confirmed_only=self._confirmed_only)
        for m in tail:
            self._apply(m)
            self.applied = m.queue_offset + 1
            folded += 1
        return folded
