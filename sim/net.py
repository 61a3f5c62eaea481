"""Simulated time, processes and network: the event queue every other part of the simulator runs on.

One thread, one `random.Random(seed)`, one clock (`Sim.now`, true milliseconds). Everything that
happens is an event in a heap ordered by (time, sequence number), so a seed replays bit for bit.

- `Node`: a process with a local monotonic clock that runs at a rate within ``1 ± DRIFT`` of true
  time (the lease's bounded-drift assumption, docs/ARCHITECTURE.md §3.5), an incarnation number
  (a crash drops every timer and message addressed to the old one) and a pause (SIGSTOP-like:
  events addressed to it wait until it resumes, in order).
- `Sim.send`: a datagram-like message (the controller RPCs, each a gRPC call that may be lost,
  delayed, duplicated by a retry, overtaken by another call, or run by the server long after the
  caller gave up on it).
- `Conn`: a stream (the HA connection, TCP): in order, never duplicated; a cut link or a lost
  segment breaks it, and each end learns it after a detection delay.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable
from random import Random
from typing import Any

DRIFT = 0.01  # bound on a clock's rate error: every local clock runs within 1% of true time
TRACE_KEEP = 400  # events kept for the report of a violation
# A seed's world fires 4,000-8,000 events in its simulated minute (seeds 0-199); one that fires
# 25 times the most is running away (a loop of events that feeds itself), and would otherwise hold
# its worker, growing, until the batch is stopped: it fails instead, with its replay command.
MAX_EVENTS = 200_000


class Runaway(Exception):
    """A seed fired more events than any world of its size needs (`MAX_EVENTS`)."""


Fn = Callable[..., None]


class Node:
    """A process: a local clock, an incarnation, a pause."""

    serves_rpcs = False  # a server of the controller RPCs: a request to it may be replayed late

    def __init__(self, sim: Sim, name: str, dc: str) -> None:
        self.sim = sim
        self.name = name
        self.dc = dc
        self.up = True
        self.inc = 0
        self.paused_until = 0
        self.base_rate = 1.0 + sim.rng.uniform(-DRIFT, DRIFT)
        self.rate = self.base_rate
        self._base_true = 0
        self._base_local = 10_000 + sim.rng.randrange(100_000)

    def local(self) -> int:
        """This process's monotonic clock, in ms."""
        return self._base_local + int((self.sim.now - self._base_true) * self.rate)

    def set_rate(self, rate: float) -> None:
        self._base_local = self.local()
        self._base_true = self.sim.now
        self.rate = rate

    def live(self) -> bool:
        return self.up and self.paused_until <= self.sim.now

    def after(self, local_ms: int, fn: Fn, *args: Any) -> None:
        """Run `fn` when this process's clock has advanced by `local_ms` (if it still lives)."""
        sim = self.sim
        sim.at(sim.now + max(1, int(local_ms / self.rate)), sim.fire, self, self.inc, fn, args)


class Conn:
    """One HA connection between a master and a slave."""

    __slots__ = ("alive", "answered", "incs", "last", "master", "send_offset", "shook", "slave")

    def __init__(self, master: Any, slave: Any) -> None:
        # the two brokers (typed loosely: this module knows processes, not brokers)
        self.master = master
        self.slave = slave
        self.alive = True
        self.shook = False  # the master answered the handshake on it
        self.answered = False  # the slave took that answer (its fork repair comes first): it may ack
        # the incarnations it connects: a frame to a process that restarted meets a reset
        self.incs = {master.name: master.inc, slave.name: slave.inc}
        self.last = 0  # delivery time of the last segment: a stream keeps its order
        self.send_offset = 0


class Sim:
    def __init__(self, seed: int, *, trace: bool = False) -> None:
        self.seed = seed
        self.rng = Random(seed)
        self.now = 0
        self._q: list[tuple[int, int, Fn, tuple[Any, ...]]] = []
        self._seq = 0
        self.full_trace: list[tuple[int, str, tuple[Any, ...]]] | None = [] if trace else None
        self.ring: deque[tuple[int, str, tuple[Any, ...]]] = deque(maxlen=TRACE_KEEP)
        # the network's state: directed cuts (counted: faults overlap), and the active impairments
        self.cuts: Counter[tuple[str, str]] = Counter()
        self.loss = 0.0
        self.dup = 0.0
        self.extra_delay = 0
        self.replay = 0.0  # probability that a request is delivered once more, late
        self.replay_late = 0  # ... up to this many ms after the first delivery
        self.events = 0

    # ------------------------------------------------------------------ events

    def at(self, t: int, fn: Fn, *args: Any) -> None:
        heapq.heappush(self._q, (t, self._seq, fn, args))
        self._seq += 1

    def fire(self, node: Node, inc: int, fn: Fn, args: tuple[Any, ...]) -> None:
        if node.inc != inc or not node.up:
            return
        if node.paused_until > self.now:
            self.at(node.paused_until, self.fire, node, inc, fn, args)
            return
        fn(*args)

    def run_until(self, t_end: int) -> None:
        q = self._q
        pop = heapq.heappop
        cap = MAX_EVENTS
        while q and q[0][0] <= t_end:
            t, _, fn, args = pop(q)
            self.now = t
            self.events += 1
            if self.events > cap:
                raise Runaway(
                    f"more than {cap} events by {t / 1000:.3f} s ({len(q)} queued): "
                    f"a loop of events that feeds itself"
                )
            fn(*args)
        self.now = t_end

    def tr(self, fmt: str, *args: Any) -> None:
        item = (self.now, fmt, args)
        self.ring.append(item)
        if self.full_trace is not None:
            self.full_trace.append(item)

    def trace_lines(self, items: Any) -> list[str]:
        return [f"{t / 1000:9.3f}s  {fmt % args if args else fmt}" for t, fmt, args in items]

    # ------------------------------------------------------------------ network

    def link(self, a: Node, b: Node) -> bool:
        return (a.name, b.name) not in self.cuts

    def delay(self, rng: Random | None = None) -> int:
        rng = rng or self.rng
        d = 1 + rng.randrange(4)
        if self.extra_delay:
            d += rng.randrange(self.extra_delay)
        return d

    def send(self, src: Node, dst: Node, fn: Fn, *args: Any, rng: Random | None = None) -> None:
        """One RPC message: lost on a cut link or to loss, else delivered after a delay (maybe twice).
        `rng`: the draws' own source (a part of the world that must not shift the others' draws)."""
        if not src.live() or (src.name, dst.name) in self.cuts:
            return
        rng = rng or self.rng
        if self.loss and rng.random() < self.loss:
            return
        self.at(self.now + self.delay(rng), self.fire, dst, dst.inc, fn, args)
        if self.dup and rng.random() < self.dup:
            self.at(self.now + self.delay(rng) + rng.randrange(50), self.fire, dst, dst.inc, fn, args)
        if self.replay and dst.serves_rpcs and rng.random() < self.replay:
            # a call the caller gave up on (its deadline passed, it asked again) that the server
            # still runs later: a request held in a connection's queue or a proxy's buffer
            late = self.delay(rng) + rng.randrange(self.replay_late)
            self.at(self.now + late, self.fire, dst, dst.inc, fn, args)

    def conn_send(self, conn: Conn, src: Node, dst: Node, fn: Fn, *args: Any) -> None:
        """A frame on an HA connection: in order; a cut or a lost segment breaks the connection."""
        if not conn.alive:
            return
        if not dst.up or dst.inc != conn.incs[dst.name]:
            self.break_conn(conn, 20)
            return
        if (src.name, dst.name) in self.cuts or (self.loss and self.rng.random() < self.loss):
            self.break_conn(conn, 1000 + self.rng.randrange(2000))
            return
        t = max(conn.last, self.now + self.delay())
        conn.last = t
        self.at(t, self._deliver, conn, dst, dst.inc, fn, args)

    def _deliver(self, conn: Conn, dst: Node, inc: int, fn: Fn, args: tuple[Any, ...]) -> None:
        if not conn.alive:
            return
        if not dst.up or dst.inc != inc:
            # the process the frame was for is gone (crashed, or its store failed and it started
            # over): its port answers the frame with a reset, so both ends learn, as at a send
            self.break_conn(conn, 20)
            return
        self.fire(dst, inc, fn, args)

    def break_conn(self, conn: Conn, detect_ms: int) -> None:
        """Both ends learn after `detect_ms` (a reset is fast, a silent link takes the idle timeout)."""
        if not conn.alive:
            return
        conn.alive = False
        for end in (conn.master, conn.slave):
            closed = getattr(end, "ha_closed", None)
            if closed is not None:
                self.at(self.now + detect_ms, self.fire, end, end.inc, closed, (conn,))
