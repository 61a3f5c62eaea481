"""The fault schedule of a seed: drawn from the seed, applied as timed events, shrinkable.

A schedule is a list of `Fault(start_ms, kind, target, duration_ms, param)`. Every fault heals by
itself after its duration (instant ones — a bit flip, a leader change — have none), so the end of
the last fault is when the system must recover (the liveness check). Faults overlap freely:
partitions and cuts are counted per link, crashes and pauses per process.

Kinds:
  loss         each message (and each HA segment: the connection breaks) lost with probability p
  delay        up to `param` ms of extra delay per message (which reorders RPCs)
  dup          each RPC delivered twice with probability p (a retried call)
  replay       each request to a controller run once more with probability `REPLAY_P`, up to `param` ms
               late (a call its caller gave up on, held in a queue or a proxy, that still arrives)
  partition    the datacenter `target` cut from the others, both ways
  oneway       messages from `target` to `param` are dropped (one direction only)
  crash        a process dies; it restarts when the fault heals (unsynced writes lost, torn tail)
  pause        a process stops (SIGSTOP) and resumes with its timers and messages overdue
  disk         a broker's disk fails (full, or I/O errors): the next write or fsync fails, fail-stop
  bitflip      a bit flips in one stored record of a broker (detected by CRC)
  drift        a process's clock runs at another rate within the bound `DRIFT`
  leader       the controllers' leader steps down (a Raft leader change)
  ctrl_cut     every controller unreachable from every broker
  ctrl_split   one controller cut from the other controllers (both ways), not from the brokers: a
               leader cut off this way answers heartbeats from its stale state until it steps down
  failover_split  a correlated failure, its targets chosen when it begins: the current master
               crashes for `duration` ms, and `param` ms after the crash the current controller
               leader is cut from the other controllers for `SPLIT_MS` (so it answers from the
               state before the failover while the others elect a new master, and the old master
               comes back hearing both)
  lease_lapse  (drawn apart, in half the worlds of 3 brokers with 2 acks needed: `LAPSE_P`)
               a correlated failure that makes a master's lease run out while a write waits for
               its acks, its targets chosen when it begins (3 brokers): one slave (s1) is cut from
               the controllers; `LAPSE_LEAD_MS` later the master is cut from the controllers and
               from the other slave (s2); `param` ms after that, about when its last lease ends,
               s1 pauses for `lapse_pause_ms(param)`, so the acks of the writes appended just
               before come back after the lease ran out and after s2, which lacks them, was
               elected. The master must not acknowledge them (the lease checked after the acks).
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

from .net import DRIFT

HORIZON_MS = 60_000  # faults start within the first minute
REPLAY_P = 0.5  # during a replay fault, the share of requests to controllers run once more, late
SPLIT_MS = 4000  # how long a failover_split cuts the controller leader from the others
LAPSE_LEAD_MS = 2000  # how long before the master a lease_lapse cuts its slave s1 from the controllers


def lapse_pause_ms(param: float) -> int:
    """How long a lease_lapse pauses s1: long enough that its acks come back after the controllers
    elected s2, short enough that they still come within the write's slave timeout (3 s)."""
    return 2400 + int(param) % 500


@dataclass(frozen=True)
class Fault:
    start: int
    kind: str
    target: str
    duration: int
    param: float = 0.0

    @property
    def end(self) -> int:
        if self.kind == "failover_split":
            return self.start + max(self.duration, int(self.param) + SPLIT_MS)
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
    ("ctrl_split", 2),
    ("replay", 2),
    ("failover_split", 1),
)


def draw(rng: Random, count: int, brokers: list[str], ctrls: list[str], dcs: list[str]) -> list[Fault]:
    names = [k for k, w in KINDS for _ in range(w)]
    out = []
    for _ in range(count):
        kind = rng.choice(names)
        start = 1000 + rng.randrange(HORIZON_MS - 1000)
        dur = 200 + rng.randrange(8000)
        out.append(_shape(rng, Fault(start, kind, "", dur), brokers, ctrls, dcs))
    out.sort(key=lambda f: (f.start, f.kind, f.target))
    return out


#: the share of the worlds where the lease matters (3 brokers, 2 acks needed) that also get one
#: lease_lapse, drawn apart (`lapse`) so that every other seed's schedule stays what it was
LAPSE_P = 0.5


def lapse(rng: Random) -> Fault:
    """One lease_lapse fault at a random time within the horizon."""
    start = 1000 + rng.randrange(HORIZON_MS - 1000)
    param = float(2700 + rng.randrange(1000))
    dur = LAPSE_LEAD_MS + int(param) + lapse_pause_ms(param) + 3000 + rng.randrange(2000)
    return Fault(start, "lease_lapse", "", dur, param)


# the lateness a delay or a replay fault draws from
LATENESS = {"delay": (50, 200, 1000, 3000), "replay": (3000, 8000, 16000)}


def _shape(rng: Random, f: Fault, brokers: list[str], ctrls: list[str], dcs: list[str]) -> Fault:
    """The target, parameter and duration of one drawn fault of `f.kind`."""
    kind, dur = f.kind, f.duration
    procs = brokers + ctrls
    targets = {"partition": dcs, "disk": brokers, "bitflip": brokers, "drift": procs, "ctrl_split": ctrls}
    target, param = "", 0.0
    if kind in ("loss", "dup"):
        param = round(rng.uniform(0.01, 0.3), 3)
    elif kind in LATENESS:
        param = float(rng.choice(LATENESS[kind]))
    elif kind == "oneway":
        target, other = rng.sample(procs, 2)
        param = float(procs.index(other))
    elif kind in ("crash", "pause"):
        target = rng.choice(procs)
        dur = 100 + rng.randrange(12_000)
    elif kind in targets:
        target = rng.choice(targets[kind])
        if kind == "drift":
            param = round(1 + rng.uniform(-DRIFT, DRIFT), 5)
    elif kind == "failover_split":
        param = float(3000 + rng.randrange(1500))
        dur = int(param) + 1000 + rng.randrange(2000)
    if kind in ("bitflip", "leader"):
        dur = 0
    return Fault(f.start, kind, target, dur, param)
