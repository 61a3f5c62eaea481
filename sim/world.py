"""One simulated cluster under one seed: 3 controllers, 2 or 3 brokers, a producer and a reader.

`run_seed(seed)` draws the scenario and the fault schedule from the seed, runs the world for the
schedule plus the recovery window, checks after every event that changes what the checker watches
(`sim.checker`) and at the end, and returns a `Outcome` (the violation and the trace around it, if
any). The same seed and schedule give the same run, event for event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random

from tidelog.controller.model import BrokerSet
from tidelog.ha.ackpolicy import AckConfig
from tidelog.invariants import InvariantViolation

from .broker import HB_INTERVAL, Broker
from .checker import Checker, Violation
from .controllers import ELECT_MAX, FALLBACK, HB_TIMEOUT, SET, Controller, Raft, register_commands
from .disk import DiskFailed, DivergedError
from .faults import LAPSE_LEAD_MS, LAPSE_P, REPLAY_P, SPLIT_MS, Fault, draw, lapse, lapse_pause_ms
from .ledger import LedgerModel
from .net import Node, Runaway, Sim

DEFAULT_FAULTS = 20
# After the last fault heals: Raft needs a stale leader's fallback and an election, then the new
# leader's grace (one heartbeat timeout), then a round (a heartbeat and the election retry), then a
# write's round trip with a slave timeout to spare.
LIVENESS_MS = FALLBACK + ELECT_MAX + HB_TIMEOUT + 2 * HB_INTERVAL + 4000
WRITE_EVERY = 250
READ_EVERY = 500
CLIENT_TIMEOUT = 5000
DCS = ["dc1", "dc2", "dc3"]


@dataclass
class Outcome:
    seed: int
    ok: bool
    violation: str = ""
    at_ms: int = 0
    trace: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    sim_ms: int = 0
    acks: int = 0
    events: int = 0


class Client(Node):
    """A producer (a few writes in flight, retried elsewhere on failure) and a reader."""

    def __init__(self, sim: Sim, world: World) -> None:
        super().__init__(sim, "client", "dc0")  # its own datacenter: partitions cut replicas, not the client
        self.world = world
        self.next_mid = 1
        self.inflight: dict[int, int] = {}
        self.target = 0
        self.acked_at: list[int] = []
        self.after(WRITE_EVERY, self.write)
        self.after(READ_EVERY, self.read)

    def write(self) -> None:
        self.after(WRITE_EVERY, self.write)
        if len(self.inflight) >= 3:
            return
        brokers = self.world.brokers
        target = brokers.get(self.target) or self.sim.rng.choice(list(brokers.values()))
        mid = self.next_mid
        self.next_mid += 1
        self.inflight[mid] = target.bid
        self.sim.send(self, target, target.on_produce, self, mid, mid, 1 + self.sim.rng.randrange(3))
        self.after(CLIENT_TIMEOUT, self.timeout, mid)

    def timeout(self, mid: int) -> None:
        if self.inflight.pop(mid, None) is not None:
            self.target = 0

    def on_reply(self, mid: int, code: str, hint: int) -> None:
        if self.inflight.pop(mid, None) is None:
            return
        if code == "OK":
            self.acked_at.append(self.sim.now)
        else:
            self.target = hint if hint > 0 else 0

    def read(self) -> None:
        """Read the newest confirmed record and one at random from a replica (a consumer)."""
        self.after(READ_EVERY, self.read)
        b = self.sim.rng.choice(list(self.world.brokers.values()))
        if not b.live() or b.stopped or not self.sim.link(self, b):
            return
        disk = b.disk
        below = disk.range(0, disk.confirm)
        if not below:
            return
        for start, _, _, mid in (below[-1], self.sim.rng.choice(below)):
            if start not in disk.corrupt:  # a damaged record fails its CRC: the reader goes elsewhere
                self.world.checker.on_read(b, start, mid)


class World:
    def __init__(self, seed: int, faults: list[Fault] | None, n_faults: int, trace: bool) -> None:
        self.sim = sim = Sim(seed, trace=trace)
        rng: Random = sim.rng
        # two replicas (every write needs both while both are in the set), three with every member
        # needed, three with two needed (the lease matters there: the replication rule covers a write
        # only when every member holds it)
        pick = rng.random()
        n = 2 if pick < 0.4 else 3
        all_ack = 0.4 <= pick < 0.7
        cfg = (
            AckConfig("sync", 3, 1, True, all_ack_in_sync_state_set=True)
            if all_ack
            else AckConfig("sync", 2, 1, auto_in_sync_replicas=True)
        )
        self.checker = Checker(strict_acks=all_ack or n == 2)
        self.raft = Raft(sim)
        self.ctrls = [Controller(sim, self.raft, f"c{i}", DCS[i]) for i in range(3)]
        self.raft.ctrls = self.ctrls
        self.raft.on_sync_state_set = self._on_sync_state_set
        broker_dcs = ["dc1", "dc2", "dc1"][:n]
        self.brokers = {i: Broker(sim, self, i, broker_dcs[i - 1], cfg) for i in range(1, n + 1)}
        self.client = Client(sim, self)
        self.ledger = LedgerModel(sim, self.brokers, seed)
        self.raft.bootstrap(register_commands(n, broker_dcs))
        self.procs: dict[str, Node] = {b.name: b for b in self.brokers.values()}
        self.procs.update({c.name: c for c in self.ctrls})
        if faults is None:
            faults = draw(
                Random(seed * 7919 + 1),
                n_faults,
                [b.name for b in self.brokers.values()],
                sorted(self.procs)[n:],
                DCS,
            )
            extra = Random(seed * 7919 + 2)
            if n == 3 and not all_ack and extra.random() < LAPSE_P:
                faults = sorted([*faults, lapse(extra)], key=lambda f: (f.start, f.kind, f.target))
        self.faults = faults
        self._fault_cuts: dict[Fault, list[tuple[str, str]]] = {}  # links a correlated fault cut
        self.scenario = f"{n} brokers, {'all_ack' if all_ack else 'in_sync_replicas 2 (auto)'}"
        for f in faults:
            sim.at(f.start, self._begin, f)
            if f.duration:
                sim.at(f.end, self._end, f)
        self.heal_at = max((f.end for f in faults), default=0)

    def _on_sync_state_set(self, bs: BrokerSet, before: frozenset[int]) -> None:
        members = bs.sync_state_set
        self.checker.on_expansion(self.brokers, members - before, members, bs.sss_epoch)

    # ------------------------------------------------------------------ faults

    def _proc(self, name: str) -> Node:
        return self.procs[name]

    def _links(self, f: Fault) -> list[tuple[str, str]]:
        nodes = [*self.procs.values(), self.client]
        if f.kind == "partition":
            # the client stays on both sides: it reaches whichever master it can, as producers
            # elsewhere in the network would
            inside = [p.name for p in nodes if p.dc == f.target]
            outside = [p.name for p in nodes if p.dc != f.target and p is not self.client]
            return [(a, b) for a in inside for b in outside] + [(b, a) for a in inside for b in outside]
        if f.kind == "oneway":
            return [(f.target, sorted(self.procs)[int(f.param)])]
        if f.kind == "ctrl_split":
            others = [c.name for c in self.ctrls if c.name != f.target]
            return [(f.target, o) for o in others] + [(o, f.target) for o in others]
        brokers = [b.name for b in self.brokers.values()] + ["client"]
        ctrls = [c.name for c in self.ctrls]
        return [(a, b) for a in brokers for b in ctrls] + [(b, a) for a in brokers for b in ctrls]

    def _begin(self, f: Fault) -> None:
        sim = self.sim
        sim.tr("FAULT %s", f)
        k = f.kind
        if k == "loss":
            sim.loss = f.param
        elif k == "dup":
            sim.dup = f.param
        elif k == "delay":
            sim.extra_delay = int(f.param)
        elif k == "replay":
            sim.replay, sim.replay_late = REPLAY_P, int(f.param)
        elif k in ("partition", "oneway", "ctrl_cut", "ctrl_split"):
            for link in self._links(f):
                sim.cuts[link] += 1
        else:
            self._begin_proc(f)

    def _begin_proc(self, f: Fault) -> None:
        sim, k = self.sim, f.kind
        if k == "leader":
            self.raft.step_down()
            return
        correlated = {"failover_split": self._failover_split, "lease_lapse": self._lease_lapse}
        if k in correlated:
            correlated[k](f)
            return
        p = self._proc(f.target)
        if k == "crash" and p.up:
            if isinstance(p, Broker):
                p.crash()
            else:
                p.up, p.inc = False, p.inc + 1
                if isinstance(p, Controller):
                    p.leading = False
        elif k == "pause":
            p.paused_until = max(p.paused_until, f.end)
        elif k == "drift":
            p.set_rate(f.param)
        elif k == "disk" and isinstance(p, Broker):
            p.disk_faults += 1
            p.disk.failing = True
        elif k == "bitflip" and isinstance(p, Broker):
            where = p.disk.flip(sim.rng)
            sim.tr("b%d: a bit flips in the record at %s", p.bid, where)

    def _end(self, f: Fault) -> None:
        sim, k = self.sim, f.kind
        sim.tr("HEAL %s", f)
        if k == "loss":
            sim.loss = 0.0
        elif k == "dup":
            sim.dup = 0.0
        elif k == "delay":
            sim.extra_delay = 0
        elif k == "replay":
            sim.replay = 0.0
        elif k in ("partition", "oneway", "ctrl_cut", "ctrl_split"):
            for link in self._links(f):
                sim.cuts[link] -= 1
                if sim.cuts[link] <= 0:
                    del sim.cuts[link]
        else:
            self._end_proc(f)

    def _failover_split(self, f: Fault) -> None:
        """Crash the master now, cut the controller leader from its peers `param` ms later."""
        sim = self.sim
        master = self.master()
        if master is not None:
            sim.tr("b%d (the master) crashes", master.bid)
            master.crash()
            sim.at(f.start + f.duration, self._back, master)
        sim.at(f.start + int(f.param), self._split_leader, f)

    def _lease_lapse(self, f: Fault) -> None:
        """Cut a slave from the controllers now; the master from them and from the other slave
        `LAPSE_LEAD_MS` later; pause the first slave `param` ms after that (sim/faults.py)."""
        sim = self.sim
        master = self.master()
        slaves = [b for b in self.brokers.values() if b is not master and b.live()]
        if master is None or len(slaves) < 2:
            sim.tr("lease_lapse: no master with two live slaves")
            return
        s1, s2 = sim.rng.sample(slaves, 2)
        ctrls = [c.name for c in self.ctrls]
        sim.tr("b%d (slave) is cut from the controllers", s1.bid)
        self._cut(f, [(s1.name, c) for c in ctrls] + [(c, s1.name) for c in ctrls])
        lead = f.start + LAPSE_LEAD_MS
        pair = [(master.name, s2.name), (s2.name, master.name)]
        m_ctrls = [(master.name, c) for c in ctrls] + [(c, master.name) for c in ctrls]
        sim.at(
            lead,
            self._cut,
            f,
            pair + m_ctrls,
            f"b{master.bid} (the master) is cut from the controllers and b{s2.bid}",
        )
        sim.at(lead + int(f.param), self._pause_for, s1, lapse_pause_ms(f.param))

    def _cut(self, f: Fault, links: list[tuple[str, str]], why: str = "") -> None:
        """Cut `links` until `f` heals (`_end_proc` restores them)."""
        if why:
            self.sim.tr("%s", why)
        for link in links:
            self.sim.cuts[link] += 1
        self._fault_cuts.setdefault(f, []).extend(links)

    def _pause_for(self, b: Broker, ms: int) -> None:
        self.sim.tr("b%d pauses for %d ms", b.bid, ms)
        b.paused_until = max(b.paused_until, self.sim.now + ms)

    def _back(self, b: Broker) -> None:
        now = self.sim.now
        if not b.up and not any(
            g.kind == "crash" and g.target == b.name and g.start < now < g.end for g in self.faults
        ):
            b.restart()

    def _split_leader(self, f: Fault) -> None:
        leader = next((c for c in self.ctrls if c.leading and c.term == self.raft.term), None)
        if leader is None:
            return
        self.sim.tr("%s (the controller leader) is cut from the other controllers", leader.name)
        split = Fault(self.sim.now, "ctrl_split", leader.name, SPLIT_MS)
        self._begin(split)
        self.sim.at(split.end, self._end, split)

    def _end_proc(self, f: Fault) -> None:
        sim, k = self.sim, f.kind
        for link in self._fault_cuts.pop(f, []):
            sim.cuts[link] -= 1
            if sim.cuts[link] <= 0:
                del sim.cuts[link]
        if k == "crash":
            p = self._proc(f.target)
            if not p.up and not any(
                g.kind == "crash" and g.target == f.target and g.start < sim.now < g.end for g in self.faults
            ):
                p.up = True
                if isinstance(p, (Broker, Controller)):
                    p.restart() if isinstance(p, Broker) else p.start()
        elif k == "drift":
            p = self._proc(f.target)
            p.set_rate(p.base_rate)
        elif k == "disk":
            p = self._proc(f.target)
            if isinstance(p, Broker):
                p.disk_faults -= 1
                p.disk.failing = p.disk_faults > 0

    # ------------------------------------------------------------------ the run

    def master(self) -> Broker | None:
        masters = [b for b in self.brokers.values() if b.live() and not b.stopped and b.core is not None]
        return max(masters, key=lambda b: b.core.epoch if b.core else 0, default=None)

    def unrepairable(self) -> list[int]:
        """Records damaged on every replica that holds them: no replica can copy past them, so a
        write that needs a slave waits for an operator (docs/ARCHITECTURE.md §3.9); the liveness
        promise does not cover them (the simulator's seed 21602: a bit flipped in the master's only
        copy of a record no slave had yet)."""
        disks = [b.disk for b in self.brokers.values()]
        return sorted(
            {
                start
                for d in disks
                for start in d.corrupt
                if not any(o.mid_at(start) == d.mid_at(start) and start not in o.corrupt for o in disks)
            }
        )

    def run(self) -> None:
        sim = self.sim
        heal = max(self.heal_at, 1000, self.ledger.recovery_from)
        sim.run_until(heal)
        acked_before = len(self.client.acked_at)
        sim.run_until(heal + LIVENESS_MS)
        master = self.master()
        if master is None:
            raise Violation(f"liveness: no master {LIVENESS_MS} ms after the last fault healed")
        if len(self.client.acked_at) == acked_before and not self.unrepairable():
            raise Violation(
                f"liveness: no write acknowledged within {LIVENESS_MS} ms after the last fault healed"
            )
        self.checker.final(master)
        self.ledger.final()
        states = []
        for c in self.ctrls:
            c.catch_up()
            states.append(c.state)
        if any(s != states[0] for s in states[1:]):
            raise Violation("the controllers' states differ after applying the same log")
        bs = states[0].broker_sets[SET]
        epoch = master.core.epoch if master.core is not None else 0
        if bs.master_id is not None and bs.master_epoch < epoch:
            raise Violation(
                f"b{master.bid} leads epoch {epoch}, newer than the controller's {bs.master_epoch}"
            )


def run_seed(
    seed: int, *, faults: list[Fault] | None = None, n_faults: int = DEFAULT_FAULTS, trace: bool = False
) -> Outcome:
    world = World(seed, faults, n_faults, trace)
    sim = world.sim
    out = Outcome(seed, True, faults=world.faults)
    try:
        world.run()
    except (Violation, InvariantViolation, DiskFailed, DivergedError, AssertionError, Runaway) as exc:
        out.ok = False
        kind = "invariant of the real code" if isinstance(exc, InvariantViolation) else type(exc).__name__
        out.violation = f"{kind}: {exc}"
        out.at_ms = sim.now
        sim.tr("VIOLATION %s", out.violation)
    out.trace = sim.trace_lines(sim.full_trace if sim.full_trace is not None else sim.ring)
    out.sim_ms = sim.now
    out.acks = world.checker.acks
    out.events = sim.events
    return out
