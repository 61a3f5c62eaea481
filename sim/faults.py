"""The fault schedule of a seed: drawn from the seed, applied as timed events, shrinkable.

A schedule is a list of `Fault(start_ms, kind, target, duration_ms, param)`. Every fault heals by
itself after its duration (instant ones — a bit flip, a leader change — have none), so the end of
the last fault is when the system must recover (the liveness check). Faults overlap freely:
partitions and cuts are counted per link, crashes and pauses per process.

Kinds:
  loss         each message (and each HA segment: the connection breaks) lost with probability p
  delay        up to `param` ms of extra delay per message (which reorders RPCs)
  dup          each RPC delivered twice with probability p (a retried call)
  partition    the datacenter `target` cut from the others, both ways
  oneway       messages from `target` to `param` are dropped (one direction only)
  crash        a process dies; it restarts when the fault heals (unsynced writes lost, torn tail)
  pause        a process stops (SIGSTOP) and resumes with its timers and messages overdue
  disk         a broker's disk fails (full, or I/O errors): the next write or fsync fails, fail-stop
  bitflip      a bit flips in one stored record of a broker (detected by CRC)
  drift        a process's clock runs at another rate within the bound `DRIFT`
  leader       the controllers' leader steps down (a Raft leader change)
  ctrl_cut     every controller unreachable from every broker
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

from .net import DRIFT

HORIZON_MS = 60_000  # faults start within the first minute


@dataclass(frozen=True)
class Fault:
    start: int
    kind: str
    target: str
    duration: int
    param: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.duration

    def __str__(self) -> str:
        extra = f" param={self.param:g}" if self.param else ""
        return f"{self.start / 1000:.3f}s {self.kind} {self.target} for {self.duration} ms{extra}"


# kind -> weight; the processes and links are what most bugs need, the rest add noise
KINDS = (
    ("loss", 2),
    ("delay", 2),
    ("dup", 2),
    ("partition", 3),
    ("oneway", 3),
    ("crash", 4),
    ("pause", 3),
    ("disk", 1),
    ("bitflip", 1),
    ("drift", 1),
    ("leader", 2),
    ("ctrl_cut", 1),
)


def draw(rng: Random, count: int, brokers: list[str], ctrls: list[str], dcs: list[str]) -> list[Fault]:
    names = [k for k, w in KINDS for _ in range(w)]
    procs = brokers + ctrls
    out = []
    for _ in range(count):
        kind = rng.choice(names)
        start = 1000 + rng.randrange(HORIZON_MS - 1000)
        dur = 200 + rng.randrange(8000)
        target, param = "", 0.0
        if kind in ("loss", "dup"):
            param = round(rng.uniform(0.01, 0.3), 3)
        elif kind == "delay":
            param = float(rng.choice((50, 200, 1000, 3000)))
        elif kind == "partition":
            target = rng.choice(dcs)
        elif kind == "oneway":
            target, other = rng.sample(procs, 2)
            param = float(procs.index(other))
        elif kind in ("crash", "pause"):
            target = rng.choice(procs)
            dur = 100 + rng.randrange(12_000)
        elif kind in ("disk", "bitflip"):
            target = rng.choice(brokers)
            dur = 0 if kind == "bitflip" else dur
        elif kind == "drift":
            target = rng.choice(procs)
            param = round(1 + rng.uniform(-DRIFT, DRIFT), 5)
        elif kind == "leader":
            dur = 0
        out.append(Fault(start, kind, target, dur, param))
    out.sort(key=lambda f: (f.start, f.kind, f.target))
    return out
