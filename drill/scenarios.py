"""Drills: a schedule of faults under a sync-replicated producer, then a heal and a check.

A drill creates a topic on one broker set, produces to it from two threads while its schedule
applies faults (drill/faults.py), heals everything, waits for the broker set to be whole again,
and checks (`check`):

- `acked` / `acked_lost`: every acknowledged message is read back through the public client
  (0 lost is the promise under sync replication while the SyncStateSet rule holds);
- `duplicates`: extra copies read (a retried send whose first attempt was stored anyway);
- `max_write_gap_s`: the longest time without an acknowledgement (the write outage);
- `split_brain`: two masters acknowledged writes in overlapping time. Found two ways: two
  acknowledged messages at the same physical offset of a set (two histories), or a message
  acknowledged by an older epoch's master although it was sent after a newer epoch's master
  had already acknowledged one (epochs from the replicas' epoch files);
- `replicas_identical`: every replica of the set holds the same bytes up to the master's
  confirm offset (compared in the data directories), after heal.

Named scenarios (`SCENARIOS`) are the two-datacenter rehearsals; `random_schedule(seed, steps)`
draws a reproducible schedule from the same verbs. A network scenario needs a `--netns`
cluster; the process ones run on any local cluster.

The controller scenarios stop every controller (SIGSTOP) under load: the data plane must go on
without them (docs/ARCHITECTURE.md §3.5, §7.5). Their reports add `controllers_down`:
`acked` during the outage and its `max_write_gap_s`, and, where the master dies while they are
away, `elected_after_return_s` (from the first controller's return to a new master serving). A
random schedule's report covers its last controller outage.
The drill's client is given every controller's and broker's address (`localcluster.bootstrap`),
so that it finds the masters through the brokers meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog import localcluster
from tidelog.client import Client
from tidelog.commitlog.epochs import EpochFile
from tidelog.drill import faults as control
from tidelog.drill.killmaster import describe_set, drop_topic, placement_violations, read_all
from tidelog.errors import ConfigError, TidelogError, UnavailableError
from tidelog.lab import net, rules

log = logging.getLogger(__name__)

Note = Callable[[str], None]


@dataclass
class Ack:
    body: bytes
    sent: float
    acked: float
    phys_offset: int


@dataclass
class Workload:
    """Producers that record every acknowledgement (with the send and ack times)."""

    client: Client
    topic: str
    threads: int = 2
    acks: list[Ack] = field(default_factory=list)
    failed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        producer = self.client.producer()

        def run(k: int) -> None:
            seq = 0
            while not self._stop.is_set():
                body = f"{self.topic}:{k}:{seq}".encode()
                seq += 1
                sent = time.monotonic()
                try:
                    receipt = producer.send(self.topic, body)
                except TidelogError:
                    with self._lock:
                        self.failed += 1
                    continue
                with self._lock:
                    self.acks.append(Ack(body, sent, time.monotonic(), receipt.phys_offset))

        for k in range(self.threads):
            t = threading.Thread(target=run, args=(k,), name=f"drill-producer-{k}", daemon=True)
            t.start()
            self._workers.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=60)


class Drill:
    """What a schedule step can do, on one cluster and one broker set."""

    def __init__(
        self, data_dir: Path, broker_set: str, client: Client, note: Note, hold_scale: float = 1.0
    ) -> None:
        self.data_dir = data_dir
        self.hold_scale = hold_scale
        self.broker_set = broker_set
        self.client = client
        self.note = note
        self.state = localcluster.read_state(data_dir)
        self.steps: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.lab = bool(self.state.get("lab"))
        # times (monotonic) a scenario records for its report: the controllers' outage, a kill
        self.marks: dict[str, float] = {}

    def hold(self, seconds: float) -> None:
        """Let a fault (or a heal) last `seconds` times the drill's hold scale. The holds are
        sized for liveness timeouts of 3 s (controller) and 5 s (HA idle); a cluster with shorter
        ones gets the same effects from proportionally shorter holds."""
        time.sleep(seconds * self.hold_scale)

    def log(self, what: str) -> None:
        """Record a step of the drill (with its time since the start) and tell the caller."""
        at = round(time.monotonic() - self.t0, 2)
        self.steps.append({"at_s": at, "step": what})
        self.note(f"{at:7.2f}s  {what}")

    def master(self) -> dict[str, Any]:
        """The process currently named master of the drill's broker set."""
        deadline = time.monotonic() + 30
        while True:
            info = describe_set(self.client, self.broker_set)
            if info is not None and info.role.has_master:
                for p in self.state["processes"]:
                    if p.get("address") == info.role.master_address:
                        return p
            if time.monotonic() > deadline:
                raise UnavailableError(f"broker set {self.broker_set} has no master to aim at")
            time.sleep(0.2)

    def dc_of_master(self) -> str:
        dc = self.master().get("datacenter")
        if not dc:
            raise ConfigError("the master's process has no datacenter in cluster.json")
        return str(dc)

    def net(self, event: rules.Event, what: str) -> None:
        if not self.lab:
            raise ConfigError(f"`{what}` is a network fault: it needs a cluster started with --netns")
        control.network(self.data_dir, event)
        self.log(what)

    def proc(self, verb: str, name: str) -> None:
        control.process(self.data_dir, verb, name)
        self.log(f"{verb} {name}")

    def controllers(self, verb: str) -> None:
        """`pause` or `resume` every controller."""
        for p in self.state["processes"]:
            if p["kind"] == "controller":
                self.proc(verb, p["name"])
        self.marks["controllers_away" if verb == "pause" else "controllers_back"] = time.monotonic()

    def controllers_cut(self, cut: bool) -> None:
        """Cut every controller off from the brokers and the client (they still reach each other),
        or heal that."""
        if cut:
            self.net(rules.Isolate("controllers"), "isolate controllers")
            self.marks["controllers_away"] = time.monotonic()
        else:
            self.net(rules.Heal(), "heal the controllers' links")
            self.marks["controllers_back"] = time.monotonic()

    def wait_new_master(self, old: dict[str, Any], old_epoch: int, timeout_s: float) -> dict[str, Any] | None:
        """Wait, asking the replicas themselves (the controllers may be away), until another
        replica of the set serves as master of a newer epoch; returns its process."""
        from tidelog.proto import broker_pb2 as bpb

        deadline = time.monotonic() + timeout_s
        others = [
            p
            for p in self.state["processes"]
            if p.get("broker_set") == self.broker_set and p["name"] != old["name"]
        ]
        while time.monotonic() < deadline:
            for p in others:
                with contextlib.suppress(TidelogError):
                    s = self.client.runner.run(
                        self.client.aio.call_broker(p["address"], "Status", bpb.StatusRequest(), timeout=1.0)
                    )
                    if s.role == "master" and s.master_epoch > old_epoch:
                        return p
            time.sleep(0.1)
        return None

    def dc(self, verb: str, dc: str) -> None:
        control.datacenter(self.data_dir, verb, dc)
        self.log(f"dc-{verb} {dc}")

    def wait_placement_clean(self, timeout_s: float) -> list[str]:
        """Wait until the placement audit names nothing of the drill's broker set; returns the
        violation codes it named before that (logged as steps)."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                mine = [
                    (code, reason)
                    for name, code, reason in placement_violations(self.client)
                    if name == self.broker_set
                ]
            except TidelogError as exc:
                mine = [("AUDIT_UNAVAILABLE", str(exc))]
            for code, reason in mine:
                if not seen or seen[-1] != code:
                    seen.append(code)
                    self.log(f"placement audit: {code}: {reason}")
            if not mine:
                self.log("placement audit: clean")
                return seen
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"placement of {self.broker_set} not clean within {timeout_s:.0f}s: {mine}"
                )
            time.sleep(0.25)

    def heal(self) -> None:
        control.heal(self.data_dir)
        away = self.marks.get("controllers_away")
        if away is not None and self.marks.get("controllers_back", 0.0) < away:
            self.marks["controllers_back"] = time.monotonic()  # heal brought them back
        for p in self.state["processes"]:
            if not localcluster.is_running(p):
                localcluster.restart(self.data_dir, p["name"])
        self.log("heal")

    def dcs(self) -> list[str]:
        return list(
            dict.fromkeys(
                p.get("datacenter")
                for p in self.state["processes"]
                if p.get("broker_set") == self.broker_set and p.get("datacenter")
            )
        )

    def other_dc(self, dc: str) -> str:
        others = [d for d in self.dcs() if d != dc]
        if not others:
            raise ConfigError(f"broker set {self.broker_set} has replicas in one datacenter only")
        return others[0]


def _isolate_master_dc(d: Drill) -> None:
    dc = d.dc_of_master()
    d.net(rules.Isolate(dc), f"isolate {dc} (the master's datacenter)")
    d.hold(12)


def _cut_dc_link(d: Drill) -> None:
    dc = d.dc_of_master()
    other = d.other_dc(dc)
    d.net(rules.Cut(dc, other), f"partition {dc} {other}")
    d.hold(10)


def _master_from_controllers(d: Drill) -> None:
    m = d.master()["name"]
    d.net(rules.Isolate(m, "controllers"), f"isolate {m} --from controllers")
    d.hold(10)


def _client_from_master(d: Drill) -> None:
    m = d.master()["name"]
    d.net(rules.Isolate("client", m), f"isolate client --from {m}")
    d.hold(6)


def _lossy_wan(d: Drill) -> None:
    dc = d.dc_of_master()
    other = d.other_dc(dc)
    d.net(rules.Loss(dc, other, 30), f"loss {dc} {other} 30%")
    d.net(rules.Delay(dc, other, 20), f"delay {dc} {other} 20ms")
    d.hold(12)


def _flapping_link(d: Drill) -> None:
    dc = d.dc_of_master()
    other = d.other_dc(dc)
    for _ in range(4):
        d.net(rules.Cut(dc, other), f"partition {dc} {other}")
        d.hold(2)
        d.net(rules.Heal(), "heal the link")
        d.hold(2)


def _cut_then_master_dc_down(d: Drill) -> None:
    dc = d.dc_of_master()
    other = d.other_dc(dc)
    d.net(rules.Cut(dc, other), f"partition {dc} {other}")
    d.hold(8)  # the SyncStateSet shrinks to the master alone: its acks no longer need dc-b
    d.dc("down", dc)
    d.hold(8)  # without an unclean election the set has no master now


def _master_dc_down(d: Drill) -> None:
    dc = d.dc_of_master()
    d.dc("down", dc)
    d.hold(12)


def _dr_rehearsal(d: Drill) -> None:
    """BP-54's trap, rehearsed: one datacenter down for 30 s under load and back; the placement
    audit must name the broker set until the returning replica has caught up and rejoined the
    SyncStateSet, and only then does the second datacenter go down. Nothing acknowledged may be
    lost: had the second outage come while the audit still complained, it could have been."""
    first = d.dc_of_master()
    second = d.other_dc(first)
    d.dc("down", first)
    d.hold(30)
    d.dc("up", first)
    flagged = [code for code in d.wait_placement_clean(timeout_s=90) if code != "AUDIT_UNAVAILABLE"]
    if not flagged:
        raise UnavailableError(f"the placement audit never named {d.broker_set} after {first} came back")
    d.dc("down", second)
    d.hold(10)


def _kill_master(d: Drill) -> None:
    m = d.master()["name"]
    d.proc("kill", m)
    d.hold(8)


def _pause_master(d: Drill) -> None:
    m = d.master()["name"]
    d.proc("pause", m)
    d.hold(8)


def _controllers_down(d: Drill) -> None:
    """Every controller stopped (SIGSTOP) for 30 s under load, then resumed."""
    d.controllers("pause")
    try:
        d.hold(30)
    finally:
        d.controllers("resume")


def _controllers_down_then_master_dies(d: Drill) -> None:
    """Every controller stopped, then the master killed: no election can happen until a controller
    returns, and then it must be a clean one."""
    victim = d.master()
    info = describe_set(d.client, d.broker_set)
    old_epoch = int(info.role.master_epoch) if info is not None else 0
    d.controllers("pause")
    try:
        d.hold(5)
        d.proc("kill", victim["name"])
        d.marks["master_killed"] = time.monotonic()
        d.hold(10)
        early = d.wait_new_master(victim, old_epoch, timeout_s=0.5)
        if early is not None:
            d.log(f"{early['name']} became master while no controller answered")
            d.marks["master_without_controllers"] = time.monotonic()
    finally:
        d.controllers("resume")
    new = d.wait_new_master(victim, old_epoch, timeout_s=60)
    if new is None:
        d.log("no new master within 60 s of the controllers' return")
        return
    d.marks["new_master"] = time.monotonic()
    d.log(f"{new['name']} is master (epoch > {old_epoch})")


def _controllers_cut_off(d: Drill) -> None:
    """The network variant: every controller cut off from the brokers and the client for 30 s."""
    d.controllers_cut(True)
    try:
        d.hold(30)
    finally:
        d.controllers_cut(False)


SCENARIOS: dict[str, tuple[Callable[[Drill], None], bool, str]] = {
    # name: (schedule, needs the network lab, what it rehearses)
    "isolate-master-dc": (_isolate_master_dc, True, "the master's datacenter loses every link"),
    "cut-dc-link": (_cut_dc_link, True, "only the link between the two datacenters is cut"),
    "master-from-controllers": (_master_from_controllers, True, "the master cannot reach any controller"),
    "client-from-master": (_client_from_master, True, "the client cannot reach the master; all else can"),
    "lossy-wan": (_lossy_wan, True, "30% loss and 20 ms delay between the datacenters"),
    "flapping-link": (_flapping_link, True, "the link between the datacenters cut and healed every 2 s"),
    "cut-then-master-dc-down": (
        _cut_then_master_dc_down,
        True,
        "the link is cut, then the master's datacenter goes down",
    ),
    "master-dc-down": (
        _master_dc_down,
        False,
        "kill -9 of every process in the master's datacenter (isolate-master-dc's baseline)",
    ),
    "dr-rehearsal": (
        _dr_rehearsal,
        False,
        "the master's datacenter down 30 s and back; once placement is clean, the other one goes down",
    ),
    "kill-master": (_kill_master, False, "kill -9 of the master (the baseline write gap)"),
    "pause-master": (_pause_master, False, "SIGSTOP of the master for 8 s"),
    "controllers-down": (_controllers_down, False, "every controller stopped (SIGSTOP) for 30 s under load"),
    "controllers-down-then-master-dies": (
        _controllers_down_then_master_dies,
        False,
        "every controller stopped, then kill -9 of the master; the election waits for their return",
    ),
    "controllers-cut-off": (
        _controllers_cut_off,
        True,
        "every controller cut off from the brokers and the client for 30 s (they still reach each other)",
    ),
}


def _oneway(d: Drill, rng: random.Random, dc: str, other: str, side: str) -> None:
    a, b = (dc, other) if rng.random() < 0.5 else (other, dc)
    d.net(rules.Cut(a, b, oneway=True), f"partition {a} {b} --one-way")


def _random_master_from_controllers(d: Drill, rng: random.Random, dc: str, other: str, side: str) -> None:
    m = d.master()["name"]
    d.net(rules.Isolate(m, "controllers"), f"isolate {m} --from controllers")


def _loss(d: Drill, rng: random.Random, dc: str, other: str, side: str) -> None:
    pct = rng.choice([10, 30, 50])
    d.net(rules.Loss(dc, other, pct), f"loss {dc} {other} {pct}%")


def _delay(d: Drill, rng: random.Random, dc: str, other: str, side: str) -> None:
    ms = rng.choice([5, 20, 50])
    d.net(rules.Delay(dc, other, ms), f"delay {dc} {other} {ms}ms")


def _random_client_from_master(d: Drill, rng: random.Random, dc: str, other: str, side: str) -> None:
    m = d.master()["name"]
    d.net(rules.Isolate("client", m), f"isolate client --from {m}")


#: The faults a random schedule draws from: (drill, rng, master's dc, the other dc, a random one of
#: the two). The process faults work on any cluster; the network ones need a --netns lab. The
#: order and the rng calls are part of a seed's schedule: reordering changes every recorded seed.
RandomFault = Callable[[Drill, random.Random, str, str, str], None]
_PROCESS_FAULTS: dict[str, RandomFault] = {
    "kill-master": lambda d, rng, dc, other, side: d.proc("kill", d.master()["name"]),
    "pause-master": lambda d, rng, dc, other, side: d.proc("pause", d.master()["name"]),
}


def _random_controllers_down_then_master_dies(
    d: Drill, rng: random.Random, dc: str, other: str, side: str
) -> None:
    victim = d.master()["name"]
    d.controllers("pause")
    d.proc("kill", victim)


#: Appended after the others (every seed's schedule changed when they were added).
_CONTROLLER_FAULTS: dict[str, RandomFault] = {
    "controllers-down": lambda d, rng, dc, other, side: d.controllers("pause"),
    "controllers-down-then-master-dies": _random_controllers_down_then_master_dies,
}
_NETWORK_FAULTS: dict[str, RandomFault] = {
    "isolate-dc": lambda d, rng, dc, other, side: d.net(rules.Isolate(side), f"isolate {side}"),
    "partition": lambda d, rng, dc, other, side: d.net(rules.Cut(dc, other), f"partition {dc} {other}"),
    "partition-oneway": _oneway,
    "master-from-controllers": _random_master_from_controllers,
    "loss": _loss,
    "delay": _delay,
    "client-from-master": _random_client_from_master,
    "controllers-cut-off": lambda d, rng, dc, other, side: d.controllers_cut(True),
}


def random_schedule(seed: int, steps: int, lab: bool) -> Callable[[Drill], None]:
    """A reproducible schedule of `steps` faults, each held 1–5 s and healed."""
    rng = random.Random(seed)
    faults = {**_PROCESS_FAULTS, **(_NETWORK_FAULTS if lab else {}), **_CONTROLLER_FAULTS}

    def run(d: Drill) -> None:
        for _ in range(steps):
            kind = rng.choice(list(faults))
            hold = rng.uniform(1.0, 5.0)
            dc = d.dc_of_master()
            other = d.other_dc(dc) if len(d.dcs()) > 1 else dc
            side = rng.choice([dc, other])
            faults[kind](d, rng, dc, other, side)
            d.hold(hold)
            d.heal()
            d.hold(rng.uniform(0.5, 2.0))

    return run


def run(
    data_dir: Path,
    scenario: str | None = None,
    *,
    seed: int | None = None,
    steps: int = 5,
    broker_set: str | None = None,
    warmup_s: float = 3.0,
    settle_s: float = 4.0,
    hold_scale: float = 1.0,
    note: Note | None = None,
    keep_topic: bool = False,
) -> dict[str, Any]:
    """Run one named scenario (or a random schedule with `seed`) and return the checked report.
    `hold_scale` scales how long each fault lasts (`Drill.hold`)."""
    if not 0 < hold_scale <= 10:
        raise ConfigError(f"the hold scale must be in (0, 10], not {hold_scale}")
    data_dir = data_dir.resolve()
    state = localcluster.read_state(data_dir)
    lab = bool(state.get("lab"))
    if seed is None:
        if scenario not in SCENARIOS:
            raise ConfigError(f"no drill scenario {scenario!r}", hint=f"one of: {', '.join(SCENARIOS)}")
        schedule, needs_lab, _ = SCENARIOS[scenario]
        if needs_lab and not lab:
            raise ConfigError(
                f"scenario {scenario} cuts the network: start the cluster with `tide cluster up --netns`"
            )
        name = scenario
    else:
        if steps < 1 or steps > 1000:
            raise ConfigError(f"steps must be 1..1000, not {steps}")
        schedule = random_schedule(seed, steps, lab)
        name = f"random seed {seed}, {steps} steps"
    broker_set = broker_set or next(
        (
            b
            for b in state["broker_sets"]
            if sum(1 for p in state["processes"] if p.get("broker_set") == b) >= 2
        ),
        None,
    )
    if broker_set is None or broker_set not in state["broker_sets"]:
        raise ConfigError("a drill needs a broker set of two or more replicas")
    say = note or (lambda _msg: None)
    topic = f"drill-{int(time.time() * 1000) % 10**9}"
    bootstrap = localcluster.bootstrap(state)
    with Client(bootstrap, send_timeout=5.0, **localcluster.client_options(state)) as client:
        client.admin().create_topic(topic, queues=4, broker_sets=[broker_set])
        drill = Drill(data_dir, broker_set, client, say, hold_scale)
        work = Workload(client, topic)
        work.start()
        time.sleep(warmup_s)
        try:
            schedule(drill)
        finally:
            drill.heal()
        time.sleep(settle_s)
        work.stop()
        whole_s = wait_whole(client, broker_set, timeout_s=90)
        drill.log("broker set whole again" if whole_s is not None else "broker set NOT whole within 90 s")
        drill.log("reading the topic back and checking")
        report = check(data_dir, client, broker_set, topic, work, drill.t0)
        outage = controllers_down_report(drill.marks, work.acks)
        if outage is not None:
            report["controllers_down"] = outage
        report["topic_deleted"] = not keep_topic and drop_topic(client, topic)
    report.update(scenario=name, steps=drill.steps, whole_after_heal=whole_s is not None)
    return report


def wait_whole(client: Client, broker_set: str, timeout_s: float) -> float | None:
    """Wait until the set has a master and every replica is in its SyncStateSet."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        info = describe_set(client, broker_set)
        if info is not None and info.role.has_master and len(info.role.sync_state_set) == len(info.members):
            return time.monotonic() - t0
        time.sleep(0.25)
    return None


def check(
    data_dir: Path, client: Client, broker_set: str, topic: str, work: Workload, t0: float
) -> dict[str, Any]:
    read = read_all(client, topic)
    counts = collections.Counter(read)
    acks = sorted(work.acks, key=lambda a: a.acked)
    times = [t0] + [a.acked for a in acks]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    identical, detail, epochs = compare_replicas(data_dir, client, broker_set)
    brain = split_brain(acks, epochs)
    return {
        "broker_set": broker_set,
        "topic": topic,
        "acked": len(acks),
        "acked_lost": sum(1 for a in acks if counts[a.body] == 0),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "sends_failed": work.failed,
        "read": len(read),
        "max_write_gap_s": round(max(gaps, default=0.0), 3),
        "split_brain": bool(brain),
        "split_brain_detail": brain,
        "replicas_identical": identical,
        "replicas_detail": detail,
    }


def controllers_down_report(marks: dict[str, float], acks: list[Ack]) -> dict[str, Any] | None:
    """What happened while the controllers were away (None when the drill stopped none): acks
    during the outage and its longest write gap, and when a master died meanwhile, how long after
    the controllers' return a new one served."""
    down, back = marks.get("controllers_away"), marks.get("controllers_back")
    if down is None or back is None:
        return None
    during = sorted(a.acked for a in acks if down <= a.acked <= back)
    times = [down, *during, back]
    out: dict[str, Any] = {
        "outage_s": round(back - down, 3),
        "acked": len(during),
        "max_write_gap_s": round(max(b - a for a, b in zip(times, times[1:], strict=False)), 3),
    }
    if "master_killed" in marks:
        out["master_killed_at_s"] = round(marks["master_killed"] - down, 3)
        out["elected_without_controllers"] = "master_without_controllers" in marks
        new = marks.get("new_master")
        out["elected_after_return_s"] = None if new is None else round(new - back, 3)
    return out


def split_brain(acks: list[Ack], epochs: list[tuple[int, int]]) -> list[str]:
    """Evidence that two masters acknowledged writes in overlapping time (empty: none)."""
    out = []
    by_offset: dict[int, bytes] = {}
    for a in acks:
        other = by_offset.setdefault(a.phys_offset, a.body)
        if other != a.body:
            out.append(
                f"two acknowledged messages at physical offset {a.phys_offset}: {other!r} and {a.body!r}"
            )
    if epochs:

        def epoch_of(offset: int) -> int:
            e = epochs[0][0]
            for epoch, start in epochs:
                if start <= offset:
                    e = epoch
            return e

        first_ack: dict[int, float] = {}
        for a in acks:
            e = epoch_of(a.phys_offset)
            first_ack[e] = min(first_ack.get(e, a.acked), a.acked)
        for a in acks:
            e = epoch_of(a.phys_offset)
            newer = [t for epoch, t in first_ack.items() if epoch > e and t < a.sent]
            if newer:
                out.append(
                    f"{a.body!r} was sent after epoch {max(k for k in first_ack if k > e)} acknowledged "
                    f"a write, and acknowledged in epoch {e}"
                )
                break
    return out[:10]


def _segments(directory: Path) -> list[tuple[int, Path]]:
    cl = directory / "commitlog"
    if not cl.is_dir():
        return []
    return sorted((int(p.name), p) for p in cl.iterdir() if p.name.isdigit())


def _read_range(directory: Path, start: int, end: int) -> bytes:
    out = bytearray()
    segs = _segments(directory)
    for i, (base, path) in enumerate(segs):
        seg_end = segs[i + 1][0] if i + 1 < len(segs) else end
        lo, hi = max(start, base), min(end, seg_end)
        if lo >= hi:
            continue
        with open(path, "rb") as f:
            f.seek(lo - base)
            out += f.read(hi - lo)
    return bytes(out)


def compare_replicas(
    data_dir: Path, client: Client, broker_set: str, timeout_s: float = 60.0
) -> tuple[bool, str, list[tuple[int, int]]]:
    """Do all replicas hold the same bytes up to the master's confirm offset? Waits for slaves to
    reach it. Returns (identical, detail, the master's epochs)."""
    from tidelog.proto import broker_pb2 as bpb

    state = localcluster.read_state(data_dir)
    procs = [p for p in state["processes"] if p.get("broker_set") == broker_set]
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {}
        for p in procs:
            with contextlib.suppress(Exception):  # an unreachable replica is reported below
                statuses[p["name"]] = client.runner.run(
                    client.aio.call_broker(p["address"], "Status", bpb.StatusRequest(), timeout=2.0)
                )
        masters = [n for n, s in statuses.items() if s.role == "master"]
        if len(statuses) == len(procs) and len(masters) == 1:
            confirm = statuses[masters[0]].confirm_offset
            if all(s.max_offset >= confirm and s.confirm_offset >= confirm for s in statuses.values()):
                break
        if time.monotonic() > deadline:
            have = {n: (s.role, s.max_offset, s.confirm_offset) for n, s in statuses.items()}
            return False, f"replicas did not converge within {timeout_s:.0f}s: {have}", []
        time.sleep(0.25)
    start = max(s.min_offset for s in statuses.values())
    dirs = {p["name"]: Path(_config_data_dir(p)) for p in procs}
    ref_name = masters[0]
    ref = _read_range(dirs[ref_name], start, confirm)
    for name, d in dirs.items():
        if name == ref_name:
            continue
        got = _read_range(d, start, confirm)
        if got != ref:
            at = next(
                (i for i, (x, y) in enumerate(zip(got, ref, strict=False)) if x != y), min(len(got), len(ref))
            )
            return (
                False,
                f"{name} differs from {ref_name} at offset {start + at} (compared {start}..{confirm})",
                [],
            )
    epochs = EpochFile(str(dirs[ref_name]), lambda: confirm).pairs()
    return True, f"{len(dirs)} replicas identical over {start}..{confirm}", epochs


def _config_data_dir(proc: dict[str, Any]) -> str:
    import yaml

    cfg = proc["args"][proc["args"].index("--config") + 1]
    with open(cfg) as f:
        return str(yaml.safe_load(f)["data_dir"])


def inside_client_netns(data_dir: Path) -> list[str] | None:
    """The command prefix that runs a drill in the lab's client namespace, or None when this
    process is already there (or the cluster has no lab)."""
    state = localcluster.read_state(data_dir.resolve())
    ns = state.get("client_netns")
    if not ns or os.environ.get(net.CLIENT_SIDE_ENV) == ns:
        return None
    return net.on_client_side(ns)


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=str)
