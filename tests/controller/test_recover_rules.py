"""The cluster-epoch fencing rules (tidelog/clusterepoch.py): an answer of an older cluster epoch is
refused, a node of an older epoch cannot join, each epoch has its own Raft password; and the
offline parts of a recovery (controller/recover.py) on a node's files."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.controllers import _EpochCheck, _read_epoch, _retryable, _write_epoch
from tidelog.client.unclean import UncleanRpo
from tidelog.clusterepoch import (
    CALLER_EPOCH_KEY,
    EPOCH_KEY,
    ClusterIdentity,
    EpochSeen,
    admit,
    may_join,
    raft_password,
    refuse_caller,
    reply_epoch,
)
from tidelog.controller import config as ccfg
from tidelog.controller.liveness import HeartbeatTable
from tidelog.controller.recover import load_identity, prepare_join, save_identity
from tidelog.controller.state import AlterSyncStateSet, ControllerState, ElectMaster, LiveInfo, RegisterBroker
from tidelog.errors import ClusterEpochFencedError, ConfigError
from tidelog.wire import ERROR_CODE_KEY, error_from_rpc

epochs = st.integers(min_value=0, max_value=1 << 40)


@given(epochs, epochs)
def test_an_answer_of_an_older_epoch_is_refused_and_a_newer_one_raises_the_known_epoch(seen, answered):
    if answered < seen:
        with pytest.raises(ClusterEpochFencedError) as exc:
            admit(seen, answered)
        assert exc.value.retryable and str(seen) in exc.value.message
    else:
        assert admit(seen, answered) == answered


def test_epoch_seen_only_grows_and_says_when_it_grew():
    seen = EpochSeen()
    assert seen.check(0) is False
    assert seen.check(2) is True and seen.value == 2
    assert seen.check(2) is False
    with pytest.raises(ClusterEpochFencedError):
        seen.check(1)
    assert seen.value == 2


def test_a_reply_without_an_epoch_is_epoch_zero():
    assert reply_epoch(()) == 0
    assert reply_epoch(None) == 0
    assert reply_epoch(((EPOCH_KEY, "3"),)) == 3
    assert reply_epoch(((EPOCH_KEY, b"4"), ("other", "9"))) == 4
    assert reply_epoch(((EPOCH_KEY, "garbage"),)) == 0


@given(st.one_of(st.none(), epochs), epochs)
def test_only_an_empty_node_or_one_of_the_same_epoch_may_join(node_epoch, cluster_epoch):
    assert may_join(node_epoch, cluster_epoch) == (node_epoch is None or node_epoch == cluster_epoch)


def test_an_older_epochs_node_cannot_join():
    assert not may_join(0, 1)
    assert may_join(None, 1)


@given(st.text(min_size=1, max_size=40), epochs, epochs)
def test_every_epoch_has_its_own_raft_password(secret, a, b):
    assert (raft_password(secret, a) == raft_password(secret, b)) == (a == b)


def test_epoch_zero_keeps_the_secret_as_the_password():
    # a cluster that was never recovered keeps its wire: old and new code agree
    assert raft_password("s3cret", 0) == "s3cret"
    with pytest.raises(ValueError):
        raft_password("s3cret", -1)


@given(epochs, st.lists(st.sampled_from(["c1", "c2", "c3"]), min_size=1, max_size=3, unique=True))
def test_identity_file_round_trip(epoch, members):
    ident = ClusterIdentity(epoch, tuple(members), "c3")
    assert ClusterIdentity.from_json(ident.to_json()) == ident


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '{"format": 1, "cluster_epoch": -1, "members": ["c1"]}',
        '{"format": 1, "cluster_epoch": 1, "members": []}',
        '{"format": 1, "cluster_epoch": 1, "members": ["c3"], "lost_datacenters": "dc-a"}',
        '{"format": 1, "cluster_epoch": 1, "members": ["c3"], "lost_datacenters": ["dc-a"], "recovered_at_ms": -1}',
    ],
)
def test_a_broken_identity_file_is_a_config_error(text):
    with pytest.raises(ConfigError):
        ClusterIdentity.from_json(text)


# --- the client's check ----------------------------------------------------------------------


class _Call:
    """A finished unary call, as an interceptor's continuation returns it."""

    def __init__(self, epoch: int | None, error: grpc.aio.AioRpcError | None = None) -> None:
        self.md = grpc.aio.Metadata(*(((EPOCH_KEY, str(epoch)),) if epoch is not None else ()))
        self.error = error

    def __await__(self):
        if self.error is not None:
            raise self.error
        yield from ()
        return "reply"

    async def initial_metadata(self):
        return self.md


async def _through(check: _EpochCheck, call: _Call) -> object:
    async def continuation(details, request):
        return call

    details = grpc.aio.ClientCallDetails("/m", None, None, None, None)
    return await check.intercept_unary_unary(continuation, details, None)


def test_the_client_refuses_an_older_epoch_as_a_retryable_typed_error():
    asyncio.run(_client_refuses())


async def _client_refuses() -> None:
    raised: list[int] = []
    check = _EpochCheck("127.0.0.1:1", EpochSeen(), raised.append)
    assert await _through(check, _Call(1)) is not None
    assert raised == [1]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _through(check, _Call(0))
    err = error_from_rpc(exc.value)
    assert isinstance(err, ClusterEpochFencedError) and _retryable(err)
    with pytest.raises(grpc.aio.AioRpcError):
        await _through(check, _Call(None))  # a controller that names no epoch is epoch 0
    assert check.seen.value == 1


def test_an_unreachable_node_is_not_taken_for_an_old_epoch():
    asyncio.run(_unreachable_passes())


async def _unreachable_passes() -> None:
    check = _EpochCheck("127.0.0.1:1", EpochSeen(3), lambda _e: None)
    down = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _through(check, _Call(None, down))
    assert exc.value is down  # passed through, not turned into a fencing


def test_the_seen_epoch_file_round_trips(tmp_path: Path):
    path = tmp_path / "controller-cluster.epoch"
    assert _read_epoch(path) == 0
    _write_epoch(path, 7)
    assert _read_epoch(path) == 7


# --- the node's files ------------------------------------------------------------------------


def _cfg(tmp_path: Path, node_id: str) -> ccfg.ControllerConfig:
    nodes = [
        {"id": f"c{i}", "raft": f"127.0.0.1:{47100 + i}", "grpc": f"127.0.0.1:{47200 + i}"} for i in (1, 2, 3)
    ]
    return ccfg.parse(
        {"nodes": nodes, "data_dir": str(tmp_path / "data"), "secret": "x" * 32}, node_id=node_id
    )


def test_a_joining_node_is_wiped_never_merged(tmp_path: Path):
    cfg = _cfg(tmp_path, "c1")
    cfg.node_dir.mkdir(parents=True)
    (cfg.node_dir / "raft.journal").write_bytes(b"old majority's log")
    moved = prepare_join(cfg, 1, ("c3",))
    assert moved is not None and (moved / "raft.journal").read_bytes() == b"old majority's log"
    assert sorted(p.name for p in cfg.node_dir.iterdir()) == ["cluster.json"]
    assert load_identity(cfg) == ClusterIdentity(1, ("c1", "c3"))


def test_a_node_of_a_newer_epoch_is_not_pulled_back(tmp_path: Path):
    cfg = _cfg(tmp_path, "c1")
    save_identity(cfg, ClusterIdentity(5, ("c1",)))
    with pytest.raises(ConfigError, match="newer"):
        prepare_join(cfg, 2, ("c3",))


def test_an_identity_naming_an_unknown_member_is_refused(tmp_path: Path):
    cfg = _cfg(tmp_path, "c1")
    save_identity(cfg, ClusterIdentity(1, ("c1", "c9")))
    with pytest.raises(ConfigError, match="c9"):
        load_identity(cfg)


# --- RULES.md L8: the datacenters a recovery declared lost ---------------------------------------

T = 3000


def _two_dc_state() -> ControllerState:
    """broker-a: master 1 in dc-a, slave 2 in dc-b, both in the SyncStateSet."""
    s = ControllerState()
    for i, dc in ((1, "dc-a"), (2, "dc-b")):
        s.apply(RegisterBroker("broker-a", f"10.0.0.{i}:1", f"10.0.0.{i}:2", datacenter=dc, identity=f"i{i}"))
    assert s.apply(ElectMaster("broker-a", 1, alive={1: LiveInfo(0, 0), 2: LiveInfo(0, 0)})).ok
    assert s.apply(AlterSyncStateSet("broker-a", 1, 1, frozenset({1, 2}), 1, alive=frozenset({1, 2}))).ok
    return s


def _recovered_leader(lost: frozenset[str], from_ms: int = 0) -> HeartbeatTable:
    """A node recovered alone, leading from 10 s, that heard the surviving slave once."""
    hb = HeartbeatTable(T)
    hb.presume_lost(lost, from_ms)
    hb.on_leadership(now_ms=10_000)
    hb.beat("broker-a", 2, 1, 0, 0, now_ms=10_100)
    return hb


def test_l8_a_silent_master_in_a_declared_lost_datacenter_is_failed_over_within_the_grace():
    s = _two_dc_state()
    hb = _recovered_leader(frozenset({"dc-a"}))
    assert hb.in_grace(10_100)
    assert hb.masters_needing_election(s, 10_100) == ["broker-a"]
    # the election it runs is the usual clean one: the SyncStateSet member it hears
    r = s.apply(ElectMaster("broker-a", None, alive=hb.alive("broker-a", 10_100)))
    assert r.ok and r.value.master_id == 2


def test_l8_without_the_declaration_the_grace_holds():
    s = _two_dc_state()
    hb = _recovered_leader(frozenset())
    assert hb.masters_needing_election(s, 10_100) == []
    hb.beat("broker-a", 2, 1, 0, 0, now_ms=10_000 + T)
    assert hb.masters_needing_election(s, 10_000 + T) == ["broker-a"]


def test_l8_another_datacenter_keeps_its_grace():
    # the master is in dc-a; only dc-c was declared lost: it may be alive and not have found us yet
    s = _two_dc_state()
    hb = _recovered_leader(frozenset({"dc-c"}))
    assert hb.masters_needing_election(s, 10_100) == []


def test_l8_not_before_the_lost_masters_last_lease_has_run_out():
    s = _two_dc_state()
    hb = _recovered_leader(frozenset({"dc-a"}), from_ms=11_000)
    assert hb.masters_needing_election(s, 10_999) == []
    hb.beat("broker-a", 2, 1, 0, 0, now_ms=11_000)
    assert hb.masters_needing_election(s, 11_000) == ["broker-a"]


def test_l8_a_master_of_the_lost_datacenter_that_is_heard_is_not_failed_over():
    s = _two_dc_state()
    hb = _recovered_leader(frozenset({"dc-a"}))
    hb.beat("broker-a", 1, 1, 0, 0, now_ms=10_100)  # it came back, or was never gone
    assert hb.masters_needing_election(s, 10_200) == []


def test_l8_nobody_alive_is_still_no_election():
    s = _two_dc_state()
    hb = HeartbeatTable(T)
    hb.presume_lost(frozenset({"dc-a"}))
    hb.on_leadership(now_ms=10_000)
    assert hb.masters_needing_election(s, 10_100) == []


def test_l8_the_declaration_holds_only_while_the_recovered_node_is_alone():
    ident = ClusterIdentity(1, ("c3",), "c3", ("dc-a",), 1_700_000_000_000)
    assert ClusterIdentity.from_json(ident.to_json()) == ident
    assert ident.presumed_lost("c3") == ("dc-a",)
    assert ClusterIdentity(1, ("c1", "c3"), "c3", ("dc-a",), 1).presumed_lost("c3") == ()
    # an identity file written before the declaration existed reads as none declared
    old = '{"format": 1, "cluster_epoch": 1, "members": ["c3"], "recovered_from": "c3"}'
    assert ClusterIdentity.from_json(old).presumed_lost("c3") == ()


# --- the unclean RPO line (client/unclean.py) ----------------------------------------------------


def test_the_rpo_counts_from_the_survivors_end_to_the_last_report_and_names_the_uncounted_tail():
    rpo = UncleanRpo(
        "broker-a", 2, in_sync=False, known_confirm_offset=9000, candidate_max_offset=4000, reported_by=1
    )
    assert rpo.bytes == 5000 and rpo.counted_until == 9000
    line = rpo.line()
    assert "RPO 5000 bytes counted, offsets 4000..9000" in line
    assert "broker 1 last reported offset 9000" in line
    assert "not counted and also lost" in line and "past offset 9000" in line


def test_a_survivor_ahead_of_the_last_report_counts_nothing():
    rpo = UncleanRpo("broker-a", 2, in_sync=False, known_confirm_offset=100, candidate_max_offset=400)
    assert rpo.bytes == 0 and rpo.counted_until == 400
    assert "past offset 400" in rpo.line()


def test_with_the_controllers_rpo_bound_the_count_reaches_past_the_report_and_leaves_no_tail():
    rpo = UncleanRpo(
        "broker-a",
        2,
        in_sync=False,
        known_confirm_offset=9000,
        candidate_max_offset=4000,
        reported_by=1,
        bound_bytes=1000,
    )
    assert rpo.bytes == 6000 and rpo.counted_until == 10000
    line = rpo.line()
    assert "RPO at most 6000 bytes, offsets 4000..10000" in line
    assert "rpo_bound_bytes=1000" in line and "nothing acknowledged past offset 10000 is lost" in line
    assert "not counted" not in line
    # no report recorded yet: the master could acknowledge only the bound itself from offset 0
    first = UncleanRpo(
        "broker-a", 2, in_sync=False, known_confirm_offset=-1, candidate_max_offset=0, bound_bytes=500
    )
    assert first.counted_until == 500 and first.bytes == 500


def test_a_survivor_in_the_sync_state_set_is_a_clean_election():
    rpo = UncleanRpo("broker-a", 2, in_sync=True, known_confirm_offset=9000, candidate_max_offset=4000)
    assert rpo.bytes == 0 and "RPO 0" in rpo.line()


# --- the controller refuses a caller that has seen a newer epoch --------------------------------


class _Aborted(Exception):
    pass


class _Context:
    """What the epoch interceptor uses of a servicer context."""

    def __init__(self, caller_epoch: int | None) -> None:
        self.md = ((CALLER_EPOCH_KEY, str(caller_epoch)),) if caller_epoch is not None else ()
        self.sent: tuple[tuple[str, str], ...] | None = None
        self.aborted: tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None = None

    async def send_initial_metadata(self, md: tuple[tuple[str, str], ...]) -> None:
        self.sent = md

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple = ()) -> None:
        self.aborted = (code, details, tuple(trailing_metadata))
        raise _Aborted


async def _serve_through(epoch: int, context: _Context) -> list[str]:
    from tidelog.controller.node import EpochInterceptor

    served: list[str] = []

    async def handler(request: str, _context: object) -> str:
        served.append(request)
        return "reply"

    async def continuation(_details: object) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(handler)

    details = SimpleNamespace(method="/tidelog.controller.v1.ControllerAdmin/CreateTopic")
    wrapped = await EpochInterceptor(epoch).intercept_service(continuation, details)
    with contextlib.suppress(_Aborted):
        await wrapped.unary_unary("create", context)
    return served


@pytest.mark.parametrize("caller", [None, 0, 1, 2])
def test_a_controller_refuses_a_caller_of_a_newer_epoch_before_acting(caller):
    context = _Context(caller)
    served = asyncio.run(_serve_through(1, context))
    assert context.sent == ((EPOCH_KEY, "1"),)  # every answer names the epoch, refusals too
    if caller is not None and caller > 1:
        assert served == [], "the replaced controller acted on the call"
        assert context.aborted is not None
        code, _details, trailing = context.aborted
        assert code == grpc.StatusCode.UNAVAILABLE
        assert dict(trailing)[ERROR_CODE_KEY] == "CLUSTER_EPOCH_FENCED"
    else:
        assert served == ["create"] and context.aborted is None


@given(epochs, epochs)
def test_refuse_caller_refuses_exactly_the_newer_callers(own, caller):
    err = refuse_caller(own, caller)
    assert (err is not None) == (caller > own)
    if err is not None:
        assert err.retryable and str(own) in err.message and str(caller) in err.message


def test_the_client_names_the_epoch_it_has_seen_in_every_call():
    asyncio.run(_client_names_its_epoch())


async def _client_names_its_epoch() -> None:
    sent: list[object] = []

    async def continuation(details, request):
        sent.append(details.metadata)
        return _Call(2)

    details = grpc.aio.ClientCallDetails("/m", None, grpc.aio.Metadata(("x", "y")), None, None)
    fresh = _EpochCheck("127.0.0.1:1", EpochSeen(), lambda _e: None)
    await fresh.intercept_unary_unary(continuation, details, None)
    assert reply_epoch(sent[-1], CALLER_EPOCH_KEY) == 0  # it saw none: it names none
    await fresh.intercept_unary_unary(continuation, details, None)  # it saw 2 in the first answer
    assert reply_epoch(sent[-1], CALLER_EPOCH_KEY) == 2
    assert ("x", "y") in list(sent[-1])  # the call's own metadata kept


def _node_with(ident: ClusterIdentity | None, timeout_ms: int = T) -> SimpleNamespace:
    """What ControllerNode._presume_lost reads of its node."""
    return SimpleNamespace(
        raft=SimpleNamespace(identity=ident),
        cfg=SimpleNamespace(node_id="c3", heartbeat_timeout_ms=timeout_ms),
        heartbeats=HeartbeatTable(timeout_ms),
    )


def test_l8_the_node_presumes_lost_from_when_the_lost_masters_lease_has_run_out():
    from tidelog.controller.node import ControllerNode, wall_ms
    from tidelog.ha.lease import handover_wait_ms

    s = _two_dc_state()
    # recovered just now: not before the longest lease granted before the command has run out
    node = _node_with(ClusterIdentity(1, ("c3",), "c3", ("dc-a",), wall_ms()))
    ControllerNode._presume_lost(node, 50_000)
    node.heartbeats.on_leadership(50_000)
    node.heartbeats.beat("broker-a", 2, 1, 0, 0, now_ms=50_000)
    assert node.heartbeats.masters_needing_election(s, 50_000) == []
    wait = handover_wait_ms(T)
    node.heartbeats.beat("broker-a", 2, 1, 0, 0, now_ms=50_000 + wait + 50)
    assert node.heartbeats.masters_needing_election(s, 50_000 + wait + 50) == ["broker-a"]
    # recovered long ago: at once
    node = _node_with(ClusterIdentity(1, ("c3",), "c3", ("dc-a",), wall_ms() - 60_000))
    ControllerNode._presume_lost(node, 50_000)
    node.heartbeats.on_leadership(50_000)
    node.heartbeats.beat("broker-a", 2, 1, 0, 0, now_ms=50_000)
    assert node.heartbeats.masters_needing_election(s, 50_000) == ["broker-a"]


@pytest.mark.parametrize(
    "ident",
    [None, ClusterIdentity(1, ("c3",), "c3"), ClusterIdentity(1, ("c1", "c3"), "c3", ("dc-a",), 1)],
    ids=["never-recovered", "nothing-declared", "grown-back"],
)
def test_l8_the_node_keeps_the_grace_without_a_declaration_or_once_grown(ident):
    from tidelog.controller.node import ControllerNode

    s = _two_dc_state()
    node = _node_with(ident)
    node.heartbeats.presume_lost(frozenset({"dc-a"}))  # cleared by the node's own view
    ControllerNode._presume_lost(node, 50_000)
    node.heartbeats.on_leadership(50_000)
    node.heartbeats.beat("broker-a", 2, 1, 0, 0, now_ms=50_000)
    assert node.heartbeats.masters_needing_election(s, 50_100) == []
