"""The three controllers: the real replicated state machine and liveness rules over a modelled Raft.

Real code: `ControllerState.apply` of `RegisterBroker`, `ElectMaster` and `AlterSyncStateSet`
(with `controller/election.py::elect` and `controller/mastership.py` inside it), and
`controller/liveness.py::HeartbeatTable` (beats, grace on leadership, witnessed silence,
`masters_needing_election`, `leaderless_sets_electable`, `alive`), driven the way
`controller/node.py::leader_tick` and `controller/service.py` drive them.

Modelled (PySyncObj): one committed log shared by all; each controller holds a prefix of it (what
the leader has replicated to it: `known`) and applies that prefix in order to its own
`ControllerState` when it needs to read (a restarted controller replays it from the start). A
controller that cannot talk to the current leader learns nothing new, so a stale leader answers
from the state it had when it was cut off, as PySyncObj's does.
A leader commits a command only while it leads the current term and a majority can talk to it;
a command in flight when the leader changes or loses its majority is lost (the caller sees no
answer). A leader cut off from a majority keeps believing it leads, and answers heartbeats from
its state, until it hears of a newer term or `leader_fallback_timeout_ms` passes, as PySyncObj's
does. Followers that cannot hear a leader elect one of themselves after a random election timeout
when a majority of them can talk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.controller.commands import AlterSyncStateSet, ElectMaster, RegisterBroker, Result
from tidelog.controller.liveness import HeartbeatTable
from tidelog.controller.model import BrokerSet
from tidelog.controller.state import ControllerState
from tidelog.ha.lease import LeaseFences, grants_lease
from tidelog.ha.roles import Role

from .net import Node, Sim

if TYPE_CHECKING:
    from .broker import Broker, ProposalRun

SET = "bs"
HB_TIMEOUT = 5000  # controller heartbeat_timeout_ms (the default)
LEADER_TICK = 250  # controller/node.py: min(0.25 s, heartbeat interval / 2)
ELECTION_RETRY = 1000  # controller/node.py ELECTION_RETRY_MS
FALLBACK = 3000  # leader_fallback_timeout_ms
ELECT_MIN, ELECT_MAX = 500, 1500  # election_min/max_timeout_ms
RAFT_TICK = 250


def role_of(bs: BrokerSet) -> Role:
    """What a reply tells a broker of its set (controller/service.py::role_of, without addresses)."""
    has = bs.master_id is not None
    mid = bs.master_id if bs.master_id is not None else 0
    return Role(
        has,
        mid,
        f"b{mid}:1" if has else "",
        f"b{mid}:2" if has else "",
        bs.master_epoch,
        bs.sync_state_set,
        bs.sss_epoch,
        bs.unclean_epoch,
    )


class Controller(Node):
    serves_rpcs = True

    def __init__(self, sim: Sim, raft: Raft, name: str, dc: str) -> None:
        super().__init__(sim, name, dc)
        self.raft = raft
        self.leading = False
        self.term = 0
        self.lost_since: int | None = None
        self.known = 0  # how much of the committed log this controller holds (kept over a restart)
        self.start()

    def start(self) -> None:
        self.state = ControllerState()
        self.applied = 0
        self.hb = HeartbeatTable(HB_TIMEOUT)
        self.fences = LeaseFences()  # RULES.md L7, as controller/node.py holds them
        self.led_term: int | None = None
        self.tried: dict[str, int] = {}
        self.after(LEADER_TICK, self.leader_tick)

    def catch_up(self) -> Result | None:
        log = self.raft.log
        result = None
        while self.applied < self.known:
            result = self.state.apply(log[self.applied])
            self.applied += 1
        return result

    # ------------------------------------------------------------------ the broker-facing calls

    def on_heartbeat(
        self, broker: Broker, bid: int, epoch: int, max_off: int, confirm: int, sent: int
    ) -> None:
        now = self.local()
        self.hb.beat(SET, bid, epoch, max_off, confirm, now)
        if not self.leading:
            return  # a copy (RULES.md L0); the answer comes from the leader
        self.catch_up()
        bs = self.state.broker_sets.get(SET)
        if bs is None or bid not in bs.members:
            return
        # ha/lease.py::grants_lease: how long ago a majority last answered this leader. The model
        # notes the loss of its majority at the Raft tick after it happens; PySyncObj's answers come
        # every append-entries period: a tick is the bound on the difference.
        age = 0.0 if self.lost_since is None else self.sim.now - self.lost_since + RAFT_TICK
        withheld = not grants_lease(age, HB_TIMEOUT) or self.fences.withholds(SET, bs.master_epoch)
        self.sim.send(self, broker, broker.on_hb_reply, role_of(bs), sent, withheld)

    def on_elect(self, broker: Broker, bid: int, restarted_epoch: int = 0) -> None:
        if not self.leading:
            return
        now = self.local()
        token = self._fence()
        cmd = ElectMaster(
            SET,
            broker_id=bid,
            alive=self.hb.alive(SET, now),
            now_ms=now,
            restarted=restarted_epoch > 0,
            restarted_epoch=restarted_epoch,
        )
        self.raft.submit(self, cmd, lambda r: self._reply_role(broker, r), self._unfence(token))

    def _fence(self) -> tuple[str, int, int]:
        """RULES.md L7: no lease for the set's current master until the election is settled."""
        self.catch_up()
        bs = self.state.broker_sets.get(SET)
        token: tuple[str, int, int] = self.fences.hold(SET, bs.master_epoch if bs is not None else 0)
        return token

    def _unfence(self, token: tuple[str, int, int]) -> Callable[[], None]:
        return lambda: self.fences.release(token)

    def _reply_role(self, broker: Broker, result: Result) -> None:
        if isinstance(result.value, BrokerSet):
            self.sim.send(self, broker, broker.on_elect_reply, role_of(result.value))

    def on_alter(
        self, broker: Broker, run: ProposalRun, attempt: int, master_id: int, master_epoch: int, seq: int
    ) -> None:
        if not self.leading:
            return
        now = self.local()
        proposal = run.proposal
        cmd = AlterSyncStateSet(
            SET,
            master_id,
            master_epoch,
            proposal.new_sync_state_set,
            proposal.sss_epoch,
            alive=self.hb.alive_ids(SET, now),
            now_ms=now,
            attempt=seq,
        )

        def done(r: Result) -> None:
            role = role_of(r.value) if isinstance(r.value, BrokerSet) else None
            self.sim.send(self, broker, broker.on_alter_reply, run, attempt, r.code, r.message, role)

        self.raft.submit(self, cmd, done)

    # ------------------------------------------------------------------ controller/node.py::leader_tick

    def leader_tick(self) -> None:
        self.after(LEADER_TICK, self.leader_tick)
        if not self.leading:
            self.led_term = None
            return
        now = self.local()
        if self.led_term != self.term:
            self.led_term = self.term
            self.hb.on_leadership(now)
            self.tried.clear()
            self.fences.clear()
            self.sim.tr("%s leads term %d", self.name, self.term)
        elif self.hb.on_tick(now):  # RULES.md L9: it was not listening (a pause)
            self.sim.tr("%s was not listening: grace again", self.name)
        self.catch_up()
        self.hb.expire(now)
        state = self.state
        names = sorted(
            set(self.hb.masters_needing_election(state, now))
            | set(self.hb.leaderless_sets_electable(state, now, False))
        )
        for name in names:
            tried = self.tried.get(name)
            if tried is not None and now - tried < ELECTION_RETRY:
                continue
            self.tried[name] = now
            token = self._fence()
            cmd = ElectMaster(name, alive=self.hb.alive(name, now), now_ms=now)
            self.raft.submit(self, cmd, self._elected, self._unfence(token))

    def _elected(self, result: Result) -> None:
        self.sim.tr("%s controller-triggered election: %s %s", self.name, result.code, result.message)


class Raft:
    """The modelled consensus: a committed log, a term, who believes it leads."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.log: list[object] = []
        self.term = 0
        self.ctrls: list[Controller] = []
        self.election_at: int | None = None
        # the checker's look at each committed SyncStateSet change: (broker set after, members before)
        self.on_sync_state_set: Callable[[BrokerSet, frozenset[int]], None] | None = None

    def bootstrap(self, commands: list[object]) -> None:
        self.log.extend(commands)
        for c in self.ctrls:
            c.known = len(self.log)
        first = self.ctrls[0]
        first.leading, first.term, self.term = True, 1, 1
        for c in self.ctrls:
            c.term = 1
        self.sim.at(RAFT_TICK, self.tick)

    def talk(self, a: Node, b: Node) -> bool:
        cuts = self.sim.cuts
        return a.live() and b.live() and (a.name, b.name) not in cuts and (b.name, a.name) not in cuts

    def quorum(self, c: Controller) -> bool:
        return c.live() and 1 + sum(1 for o in self.ctrls if o is not c and self.talk(c, o)) * 2 >= 3

    def submit(
        self,
        c: Controller,
        cmd: object,
        done: Callable[[Result], None],
        settled: Callable[[], None] | None = None,
    ) -> None:
        """Propose `cmd`; `done` gets its result once committed; `settled` runs either way, once
        the outcome is known (PySyncObj's callback: committed, or failed on a leader change)."""
        if not (c.leading and c.term == self.term):
            if settled is not None:
                settled()
            return  # a stale leader cannot commit: the majority has moved on
        sim = self.sim
        sim.at(sim.now + 2 + sim.rng.randrange(10), self._commit, c, c.inc, c.term, cmd, done, settled)

    def _commit(
        self,
        c: Controller,
        inc: int,
        term: int,
        cmd: Any,
        done: Callable[[Result], None],
        settled: Callable[[], None] | None,
    ) -> None:
        if settled is not None and c.inc == inc:
            settled()  # the process that proposed is the one still running (a restart forgot it)
        if c.inc != inc or not c.leading or c.term != term or term != self.term or not self.quorum(c):
            self.sim.tr("raft: %s lost (leader %s changed or lost its majority)", type(cmd).__name__, c.name)
            return
        c.catch_up()
        before = c.state.broker_sets.get(SET)
        members_before = before.sync_state_set if before is not None else frozenset()
        self.log.append(cmd)
        self._replicate(c)
        result = c.catch_up()
        if result is not None:
            if isinstance(cmd, (ElectMaster, AlterSyncStateSet)) and result.changed:
                self.sim.tr("raft commit: %s", result.message)
                hook = self.on_sync_state_set
                if (
                    hook is not None
                    and isinstance(cmd, AlterSyncStateSet)
                    and isinstance(result.value, BrokerSet)
                ):
                    hook(result.value, members_before)
            self.sim.fire(c, inc, done, (result,))

    def tick(self) -> None:
        sim = self.sim
        sim.at(sim.now + RAFT_TICK, self.tick)
        for c in self.ctrls:
            self._leader_checks(c)
        for c in self.ctrls:  # terms spread to every controller that can hear a newer one
            for o in self.ctrls:
                if o.term > c.term and self.talk(c, o):
                    c.term = o.term
        leader = next((c for c in self.ctrls if c.leading and c.term == self.term), None)
        if leader is not None:
            self._replicate(leader)
        if leader is not None and self.quorum(leader):
            self.election_at = None
            return
        cands = [
            c
            for c in self.ctrls
            if self.quorum(c) and not (leader is not None and self.talk(c, leader) and leader.live())
        ]
        if not cands:
            self.election_at = None
        elif self.election_at is None:
            self.election_at = sim.now + ELECT_MIN + sim.rng.randrange(ELECT_MAX - ELECT_MIN)
        elif sim.now >= self.election_at:
            self._elect(sim.rng.choice(cands))

    def _replicate(self, leader: Controller) -> None:
        """The current leader's log reaches itself and every controller that can talk to it."""
        if not leader.up:
            return
        n = len(self.log)
        leader.known = n
        for o in self.ctrls:
            if o is not leader and self.talk(leader, o):
                o.known = n

    def _leader_checks(self, c: Controller) -> None:
        if not c.leading:
            return
        if not c.up:
            c.leading = False
        elif any(o.term > c.term and self.talk(c, o) for o in self.ctrls):
            c.leading = False
            self.sim.tr("%s hears of a newer term and steps down", c.name)
        elif not self.quorum(c):
            # a paused leader hears no majority either: when it resumes, the last answer it had is
            # from before the pause (what ha/lease.py::grants_lease measures), not from now
            if c.lost_since is None:
                c.lost_since = self.sim.now
            elif c.live() and self.sim.now - c.lost_since >= FALLBACK:
                c.leading = False
                self.sim.tr("%s steps down: no majority for %d ms", c.name, FALLBACK)
        else:
            c.lost_since = None

    def _elect(self, c: Controller) -> None:
        self.term += 1
        c.term = self.term
        c.leading = True
        c.lost_since = None
        c.known = len(self.log)  # Raft's election restriction: a new leader holds every commit
        self.election_at = None
        self.sim.tr("raft: c%s elected in term %d", c.name, self.term)

    def step_down(self) -> None:
        """A leader change forced from outside (a fault)."""
        for c in self.ctrls:
            if c.leading:
                c.leading = False
                self.sim.tr("%s leader change: steps down", c.name)


def register_commands(n: int, dcs: list[str]) -> list[object]:
    return [
        RegisterBroker(
            SET,
            address=f"b{i}:1",
            ha_address=f"b{i}:2",
            datacenter=dcs[i - 1],
            identity=f"id-{i}",
            new_cluster_id="sim",
        )
        for i in range(1, n + 1)
    ]
