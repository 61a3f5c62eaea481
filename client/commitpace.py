"""The pacing of one client's group commits to one master: which waiting commits leave, and when.

Every group member of a client commits through it (client/committer.py), whatever its group. A
member's commits bound for one master are a *unit*: they travel in one call, one replicated write,
all or none, as they did when each member sent its own. A master's cost is mostly per call (the
frame or gRPC call and the write: 0.3-0.8 ms of its CPU), and little per commit (about 5 µs), so
a client with many groups sends each master their units together:

- a unit that finds the master idle (no call out, and the last one left at least `interval_s`
  ago) leaves at once: a commit of a client that commits seldom (a hand-over's, a closing
  member's) waits for nothing;
- otherwise it waits. The next call leaves once the call out has answered and `interval_s` has
  passed since that one left, carrying the waiting units oldest first, whole, up to
  `max_commits` commits (a unit larger than that alone, for the master to judge);
- a full call's worth waiting leaves as soon as the call out answers: the spacing bounds the
  calls a trickle of commits costs, never how many commits a second get through.

So one client sends a master at most one commit call per `interval_s` while commits trickle in,
however many groups it serves. One call out at a time, units in arrival order: a later commit of
a queue never lands before an earlier one.

`CommitPace.step(event, now)` is the whole rule (time passed in, no I/O); the shell runs its
actions: `Send` the units in one call, `WakeAt` a time to step again with `Tick`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import InvalidArgumentError
from tidelog.invariants import require

#: the shortest time between two commit calls of one client to one master while commits wait
DEFAULT_COMMIT_INTERVAL_MS = 100
#: the most commits one call carries: a call's commits are checked and written in one go on the
#: master's event loop (about 5 µs each), so 1,000 hold it for about 5 ms
MAX_COMMITS_PER_CALL = 1000


@dataclass(frozen=True)
class Unit:
    """One member's commits for one master: `size` commits, `token` the shell's own handle."""

    size: int
    token: Any


@dataclass(frozen=True)
class Added:
    unit: Unit


@dataclass(frozen=True)
class Answered:
    """The call out has answered (whatever the answer)."""


@dataclass(frozen=True)
class Tick:
    """A time the rule asked for (`WakeAt`) has come, or any time: a tick that is early does nothing."""


Event = Added | Answered | Tick


@dataclass(frozen=True)
class Send:
    units: tuple[Unit, ...]


@dataclass(frozen=True)
class WakeAt:
    at: float


Action = Send | WakeAt


@dataclass
class CommitPace:
    interval_s: float = DEFAULT_COMMIT_INTERVAL_MS / 1000
    max_commits: int = MAX_COMMITS_PER_CALL
    waiting: deque[Unit] = field(default_factory=deque)
    in_flight: bool = False
    last_sent: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.interval_s <= 60:
            raise InvalidArgumentError(f"a commit interval is 0 to 60 s, not {self.interval_s!r}")
        if self.max_commits < 1:
            raise InvalidArgumentError("a commit call carries at least one commit")

    def forgettable(self, now: float) -> bool:
        """Nothing waiting, no call out, and the spacing since the last call over: a new pace
        would decide as this one, so the shell may forget it (one forgotten sooner would let the
        next commit leave at once)."""
        idle = not self.waiting and not self.in_flight
        return idle and (self.last_sent is None or now >= self.last_sent + self.interval_s)

    def step(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, Added):
            require(event.unit.size >= 1, "a commit unit holds at least one commit")
            self.waiting.append(event.unit)
        elif isinstance(event, Answered):
            require(self.in_flight, "a commit call answered while none was out")
            self.in_flight = False
        if self.in_flight or not self.waiting:
            return []
        due = now if self.last_sent is None else self.last_sent + self.interval_s
        if due > now and self._waiting_commits() < self.max_commits:
            return [WakeAt(due)]
        self.in_flight = True
        self.last_sent = now
        return [Send(self._take())]

    def _waiting_commits(self) -> int:
        total = 0
        for unit in self.waiting:
            total += unit.size
            if total >= self.max_commits:
                break
        return total

    def _take(self) -> tuple[Unit, ...]:
        taken = [self.waiting.popleft()]
        total = taken[0].size
        while self.waiting and total + self.waiting[0].size <= self.max_commits:
            total += self.waiting[0].size
            taken.append(self.waiting.popleft())
        return tuple(taken)
