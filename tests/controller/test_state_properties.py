"""Properties of the controller core over random histories (RULES.md §0, §2, §4, §5, §7).

A history is a random sequence of registrations, heartbeats, silences (time passing), broker
deaths, leader changes, SyncStateSet changes (honest or stale), elections of every kind,
cleanups, offset reports and liveness scans, driven the way the service drives the core: the
leader's HeartbeatTable supplies `alive` to each command. After every step we check:

- at most one master per broker set per master epoch;
- master epoch and SyncStateSet epoch never decrease (per incarnation of a broker set);
- a master is a member and in its SyncStateSet;
- a newly elected master was alive, and with unclean election off came from the previous
  SyncStateSet (the first election excepted: there is no SyncStateSet before it);
- a result that reports no change left the state exactly as it was, and every refusal except
  the controller-triggered "no master" reports no change;
- the snapshot round-trips through JSON.
At the end the same commands applied to a fresh state, and to a state restored from a
mid-history snapshot, give an identical state (determinism).
"""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.controller.liveness import HeartbeatTable
from tidelog.controller.state import (
    AlterSyncStateSet,
    CleanBrokerData,
    ControllerState,
    ElectMaster,
    MetaCompareAndSet,
    MetaCreate,
    MetaDelete,
    RegisterBroker,
    ReportOffsets,
)

SETS = ("broker-a", "broker-b")
SLOTS = 4  # brokers per set, by identity
TIMEOUT = 5000

small = st.integers(0, 7)
ops = st.one_of(
    st.tuples(st.just("boot"), small),
    st.tuples(st.just("register"), small, small),
    st.tuples(st.just("beat"), small, small, st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("beat"), small, small, st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.sampled_from([100, 1000, 2000, 6000])),
    st.tuples(st.just("kill"), small, small),
    st.tuples(st.just("new_leader")),
    st.tuples(st.just("alter"), small, st.integers(0, 15), st.booleans(), st.integers(0, 3)),
    st.tuples(
        st.just("elect"), small, st.sampled_from(["broker", "controller", "designated"]), small, st.booleans()
    ),
    st.tuples(
        st.just("elect"), small, st.sampled_from(["broker", "controller", "designated"]), small, st.booleans()
    ),
    st.tuples(st.just("clean"), small, st.integers(0, 15), st.booleans()),
    st.tuples(st.just("report"), small, small, st.integers(0, 3), st.integers(0, 1000)),
    st.tuples(st.just("scan"), st.booleans()),
)


class World:
    """The core as the service drives it, plus the history the properties need."""

    def __init__(self) -> None:
        self.state = ControllerState()
        self.hb = HeartbeatTable(TIMEOUT)
        self.now = 0
        self.log: list[object] = []  # every command applied, in order
        self.results: list[object] = []
        self.snapshot_at: tuple[int, dict] | None = None
        # broker slot -> the epoch/offset it reports (its "log")
        self.logs: dict[tuple[str, int], tuple[int, int]] = {}
        self.masters_by_epoch: dict[tuple[str, int, int], int] = {}
        self.incarnation = dict.fromkeys(SETS, 0)
        self.last_epochs: dict[str, tuple[int, int]] = {}

    def ids(self, name: str) -> dict[int, int]:
        """slot -> broker id, for the slots currently registered in `name`."""
        bs = self.state.broker_sets.get(name)
        if bs is None:
            return {}
        return {int(m.identity.rsplit("-", 1)[1]): i for i, m in bs.members.items()}

    def apply(self, cmd: object):
        before = copy.deepcopy(self.state)
        r = self.state.apply(cmd)
        self.log.append(cmd)
        self.results.append(r)
        if not r.changed:
            assert self.state == before, f"{cmd} reported no change but changed the state"
        if not r.ok and r.code != "CONTROLLER_MASTER_NOT_AVAILABLE":
            assert not r.changed, f"refusal {r.code} reported a change"
        if isinstance(cmd, ElectMaster) and r.ok:
            self.check_election(cmd, before, r.value.master_id)
        self.check_invariants()
        return r

    def check_election(self, cmd: ElectMaster, before: ControllerState, new: int) -> None:
        old = before.broker_sets[cmd.broker_set]
        assert new in cmd.alive, "an elected master must be alive"
        assert new != old.master_id
        if not cmd.enable_unclean and old.master_epoch > 0:
            assert new in old.sync_state_set, "clean election picked a broker outside the SyncStateSet"

    def check_invariants(self) -> None:
        for name in SETS:
            bs = self.state.broker_sets.get(name)
            if bs is None:
                if name in self.last_epochs:  # the set was dropped: a later one is a new incarnation
                    del self.last_epochs[name]
                    self.incarnation[name] += 1
                continue
            if bs.master_id is not None:
                assert bs.master_id in bs.sync_state_set and bs.master_id in bs.members
                key = (name, self.incarnation[name], bs.master_epoch)
                assert self.masters_by_epoch.setdefault(key, bs.master_id) == bs.master_id, (
                    "two masters in one epoch"
                )
            epochs = (bs.master_epoch, bs.sss_epoch)
            prev = self.last_epochs.get(name, (0, 0))
            assert epochs[0] >= prev[0] and epochs[1] >= prev[1], f"epoch went back {prev} -> {epochs}"
            self.last_epochs[name] = epochs

    def pick(self, name: str, n: int) -> int | None:
        """The n-th registered broker id of `name` (modulo), so ops mostly hit real brokers."""
        ids = sorted(self.ids(name).values())
        return ids[n % len(ids)] if ids else None

    def step(self, op: tuple) -> None:
        """Apply one generated op (each kind is one method below), then snapshot at the 10th command."""
        kind = op[0]
        if kind == "boot":
            self._boot(op)
        elif kind == "register":
            self._register(op)
        elif kind == "beat":
            self._beat(op)
        elif kind == "advance":
            self._advance(op)
        elif kind == "kill":
            self._kill(op)
        elif kind == "new_leader":
            self._new_leader()
        elif kind == "alter":
            self.alter(SETS[op[1] % 2], op[2], op[3], op[4])
        elif kind == "elect":
            self._elect(op)
        elif kind == "clean":
            self._clean(op)
        elif kind == "report":
            self._report(op)
        elif kind == "scan":
            self._scan(op)
        if len(self.log) == 10 and self.snapshot_at is None:
            self.snapshot_at = (len(self.log), json.loads(json.dumps(self.state.to_dict())))

    def _boot(self, op: tuple) -> None:
        """Bring up a whole broker set (three registrations, one beat each): the common start of a history."""
        name = SETS[op[1] % 2]
        for slot in range(3):
            self.step(("register", op[1], slot))
        for bid in self.ids(name).values():
            self.hb.beat(name, bid, 0, 0, 0, self.now)

    def _register(self, op: tuple) -> None:
        """Register a slot; a slot number past SLOTS re-registers under the id it already has."""
        name, slot = SETS[op[1] % 2], op[2] % SLOTS
        known = self.ids(name).get(slot)
        self.apply(
            RegisterBroker(
                name,
                f"10.0.0.{slot}:1{op[1]}",
                f"10.0.0.{slot}:2",
                identity=f"{name}-{slot}",
                broker_id=known if op[2] >= SLOTS else None,
                now_ms=self.now,
            )
        )

    def _beat(self, op: tuple) -> None:
        """A registered broker heartbeats, its log growing (and sometimes its epoch)."""
        name = SETS[op[1] % 2]
        bid = self.pick(name, op[2])
        if bid is not None:
            epoch, offset = self.logs.get((name, bid), (0, 0))
            epoch, offset = epoch + (op[3] == 2), offset + op[4] * 10
            self.logs[(name, bid)] = (epoch, offset)
            self.hb.beat(name, bid, epoch, offset, offset, self.now, priority=op[2])

    def _advance(self, op: tuple) -> None:
        """Time passes; heartbeats older than the timeout expire."""
        self.now += op[1]
        self.hb.expire(self.now)

    def _kill(self, op: tuple) -> None:
        """A broker dies: the leader forgets its heartbeat."""
        name = SETS[op[1] % 2]
        bid = self.pick(name, op[2])
        if bid is not None:
            self.hb.forget(name, bid)

    def _new_leader(self) -> None:
        """A controller leader change: a fresh HeartbeatTable that starts its grace period now."""
        self.hb = HeartbeatTable(TIMEOUT)
        self.hb.on_leadership(self.now)

    def _elect(self, op: tuple) -> None:
        """An election by a broker, by the controller or of a designated broker (slot >= 6: a non-member)."""
        name, mode, slot, unclean = SETS[op[1] % 2], op[2], op[3], op[4]
        bid = self.pick(name, slot) if slot < 6 else 99  # 99: never a member
        self.apply(
            ElectMaster(
                name,
                None if mode == "controller" else bid,
                designated=mode == "designated",
                alive=self.hb.alive(name, self.now),
                enable_unclean=unclean,
                now_ms=self.now,
            )
        )

    def _clean(self, op: tuple) -> None:
        """Clean the data of the slots in a mask (mask 15: an empty id set)."""
        name, mask, living = SETS[op[1] % 2], op[2], op[3]
        ids = frozenset(b for s, b in self.ids(name).items() if mask >> s & 1) if mask != 15 else frozenset()
        self.apply(
            CleanBrokerData(
                name, ids, clean_living=living, alive=self.hb.alive_ids(name, self.now), now_ms=self.now
            )
        )

    def _report(self, op: tuple) -> None:
        """A broker (or the non-member 99) reports its offsets."""
        name = SETS[op[1] % 2]
        bid = self.pick(name, op[2]) or 99
        self.apply(ReportOffsets(name, bid, op[3], op[4]))

    def _scan(self, op: tuple) -> None:
        """The liveness scan: elect where a master is needed; only OK or "no master" may come back."""
        for name in self.hb.masters_needing_election(self.state, self.now):
            r = self.apply(
                ElectMaster(
                    name, None, alive=self.hb.alive(name, self.now), enable_unclean=op[1], now_ms=self.now
                )
            )
            assert r.code in ("OK", "CONTROLLER_MASTER_NOT_AVAILABLE"), r

    def alter(self, name: str, mask: int, honest: bool, skew: int) -> None:
        bs = self.state.broker_sets.get(name)
        if bs is None:
            master, epoch, sss_epoch = 1, 0, 0
        else:
            master = bs.master_id if bs.master_id is not None else 1
            epoch, sss_epoch = bs.master_epoch, bs.sss_epoch
        if not honest:  # a stale or confused master
            master, epoch, sss_epoch = (
                master + (skew == 1),
                max(0, epoch - (skew == 2)),
                max(0, sss_epoch - (skew == 3)),
            )
        ids = self.ids(name)
        if honest:  # what a real master proposes: itself plus caught-up (alive) replicas
            alive = self.hb.alive_ids(name, self.now)
            new = {b for s, b in ids.items() if mask >> s & 1 and b in alive} | {master}
        else:
            new = {b for s, b in ids.items() if mask >> s & 1}
        self.apply(
            AlterSyncStateSet(
                name,
                master,
                epoch,
                frozenset(new),
                sss_epoch,
                alive=self.hb.alive_ids(name, self.now),
                now_ms=self.now,
            )
        )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=20, max_size=80))
def test_properties_hold_over_random_histories(history: list[tuple]) -> None:
    w = World()
    for op in history:
        w.step(op)
        d = json.loads(json.dumps(w.state.to_dict()))
        assert ControllerState.from_dict(d) == w.state, "snapshot round trip"

    replay = ControllerState()
    results = [replay.apply(c) for c in w.log]
    assert replay == w.state and replay.to_dict() == w.state.to_dict(), "apply is not deterministic"
    assert results == w.results, "the same commands gave different results"

    if w.snapshot_at is not None:
        n, snap = w.snapshot_at
        restored = ControllerState.from_dict(snap)
        for c in w.log[n:]:
            restored.apply(c)
        assert restored == w.state, "a replica restored from a snapshot diverged"


def test_generator_reaches_elections_and_failovers() -> None:
    """A fixed history that exercises the failover path end to end through the same World."""
    w = World()
    for op in [
        ("register", 0, 0),
        ("register", 0, 1),
        ("register", 0, 2),
        ("beat", 0, 0, 0, 1),
        ("beat", 0, 1, 0, 1),
        ("beat", 0, 2, 0, 1),
        ("elect", 0, "broker", 0, False),
        ("alter", 0, 0b011, True, 0),
        ("advance", 3000),
        ("beat", 0, 1, 0, 2),
        ("beat", 0, 2, 0, 3),
        ("advance", 3000),
        ("scan", False),
    ]:
        w.step(op)
    bs = w.state.broker_sets["broker-a"]
    assert (bs.master_id, bs.master_epoch, bs.sync_state_set) == (2, 2, {2})
    assert w.masters_by_epoch[("broker-a", 0, 1)] == 1 and w.masters_by_epoch[("broker-a", 0, 2)] == 2


meta_ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "cas", "delete", "delete_any"]),
        st.sampled_from(["a", "b", "a/x"]),
        st.binary(max_size=12),
        st.integers(0, 4),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(meta_ops)
def test_m1_metadata_behaves_like_a_versioned_map(seq) -> None:
    """RULES.md M1-M4 against a dict model: versions start at 1 and grow by one per
    successful compare-and-set; every failure leaves the entry as it was."""
    s = ControllerState(max_meta_value_bytes=10)
    model: dict[str, tuple[bytes, int]] = {}
    for kind, key, value, version in seq:
        cur = model.get(key)
        if kind == "create":
            r = s.apply(MetaCreate(key, value))
            expect = "METADATA_TOO_LARGE" if len(value) > 10 else "METADATA_EXISTS" if cur else "OK"
            if expect == "OK":
                model[key] = (value, 1)
        elif kind == "cas":
            r = s.apply(MetaCompareAndSet(key, value, version))
            expect = (
                "METADATA_TOO_LARGE"
                if len(value) > 10
                else "METADATA_NOT_FOUND"
                if cur is None
                else "METADATA_VERSION_MISMATCH"
                if cur[1] != version
                else "OK"
            )
            if expect == "OK":
                model[key] = (value, version + 1)
        else:
            expected = version if kind == "delete" else None
            r = s.apply(MetaDelete(key, expected))
            expect = (
                "METADATA_NOT_FOUND"
                if cur is None
                else "METADATA_VERSION_MISMATCH"
                if expected is not None and cur[1] != expected
                else "OK"
            )
            if expect == "OK":
                del model[key]
        assert r.code == expect, (kind, key, r)
        assert {e.key: (e.value, e.version) for e in s.list_prefix("")} == model
