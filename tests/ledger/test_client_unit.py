"""The ledger client without a cluster: its pure helpers as tables, and the write handle, the
recovery shell and the readers driven against an in-process fake broker set whose metadata store
is the controller's real state machine (so the controller's ledger rule is exercised too)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tidelog.controller.state import ControllerState, MetaCompareAndSet, MetaCreate, MetaDelete
from tidelog.errors import (
    DigestMatchError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
    LedgerRecoveryError,
    LedgerTimeoutError,
    MetadataNotFoundError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerExistsError,
    NotEnoughBookiesError,
    NotMasterError,
    UnauthorizedAccessError,
    UnavailableError,
    by_code,
)
from tidelog.ledger import FenceOutcome, LedgerMetadata, LedgerState, ReadOutcome
from tidelog.ledger.client import (
    COUNTER_KEY,
    AsyncLedgers,
    BrokerSetView,
    ReplicaView,
    broker_set_views,
    check_entry_data,
    check_entry_range,
    fence_outcome,
    ledger_id_of_key,
    ledger_key,
    place_ledger,
    read_order,
    read_outcome,
)
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import hash_password
from tidelog.proto import controller_pb2 as cpb
from tidelog.proto import ledger_pb2 as lpb
from tidelog.tasks import within

PW = b"pw"

# --- pure helpers ---------------------------------------------------------------------------


def test_ledger_keys_round_trip_and_sort_like_ids():
    ids = [0, 7, 10, 123456789, 2**63 - 1]
    keys = [ledger_key(i) for i in ids]
    assert [ledger_id_of_key(k) for k in keys] == ids
    assert sorted(keys) == keys
    assert ledger_key(42) == "ledger/0000000000000000042"
    for other in ("ledger-id-counter", "ledger/", "ledger/abc", "group/x", COUNTER_KEY):
        assert ledger_id_of_key(other) is None


@pytest.mark.parametrize(
    ("data", "ok"),
    [
        (b"", True),
        (b"x" * 100, True),
        (bytearray(b"ab"), True),
        (memoryview(b"ab"), True),
        (b"x" * 101, False),
        ("text", False),
        (None, False),
        (3, False),
        ([1], False),
    ],
)
def test_check_entry_data(data, ok):
    if ok:
        assert check_entry_data(data, max_bytes=100) == bytes(data)
    else:
        with pytest.raises(IncorrectParameterError) as info:
            check_entry_data(data, max_bytes=100)
        assert info.value.number == -14


@pytest.mark.parametrize(
    ("first", "last", "ok"),
    [
        (0, 0, True),
        (0, 9, True),
        (5, 5, True),
        (-1, 0, False),
        (0, -1, False),
        (3, 2, False),
        (True, 2, False),
        (0, 1.0, False),
        ("0", 1, False),
        (0, 2**63, False),
    ],
)
def test_check_entry_range(first, last, ok):
    if ok:
        assert check_entry_range(first, last) == (first, last)
    else:
        with pytest.raises(IncorrectParameterError):
            check_entry_range(first, last)


def view(name: str, n: int, *, master: bool = True, dead: int = 0) -> BrokerSetView:
    members = tuple(ReplicaView(i, f"{name}:{i}", alive=i > dead) for i in range(1, n + 1))
    return BrokerSetView(name, 1 if master else None, f"{name}:1" if master else "", members, frozenset())


@pytest.mark.parametrize(
    ("name", "sets", "ledger_id", "e", "aq", "named", "expected"),
    [
        ("one fitting set", [view("a", 2)], 0, 2, 2, None, "a"),
        ("the size picks the set", [view("a", 2), view("b", 3)], 0, 3, 2, None, "b"),
        ("ids spread over equal sets", [view("a", 2), view("b", 2)], 1, 2, 1, None, "b"),
        ("ids spread over equal sets (even)", [view("a", 2), view("b", 2)], 4, 2, 1, None, "a"),
        ("a set with a dead member is skipped", [view("a", 2, dead=1), view("b", 2)], 0, 2, 2, None, "b"),
        ("a set without master is skipped", [view("a", 2, master=False), view("b", 2)], 2, 2, 2, None, "b"),
        ("no set of that size: can never succeed", [view("a", 2)], 0, 3, 2, None, IncorrectParameterError),
        (
            "sets of that size, none ready: retryable",
            [view("a", 2, dead=1)],
            0,
            2,
            2,
            None,
            NotEnoughBookiesError,
        ),
        ("no master anywhere", [view("a", 2, master=False)], 0, 2, 1, None, NotEnoughBookiesError),
        ("named set", [view("a", 2), view("b", 2)], 0, 2, 2, "b", "b"),
        ("named set of another size", [view("a", 2), view("b", 3)], 0, 2, 2, "b", IncorrectParameterError),
        ("named set unknown", [view("a", 2)], 0, 2, 2, "zz", IncorrectParameterError),
        ("named set not ready", [view("a", 2, dead=1)], 0, 2, 2, "a", NotEnoughBookiesError),
        ("AQ > E", [view("a", 2)], 0, 2, 3, None, IncorrectParameterError),
    ],
)
def test_place_ledger(name, sets, ledger_id, e, aq, named, expected):
    if isinstance(expected, str):
        assert place_ledger(sets, ledger_id, e, e, aq, broker_set=named).name == expected, name
    else:
        with pytest.raises(expected):
            place_ledger(sets, ledger_id, e, e, aq, broker_set=named)


def test_read_order_puts_slaves_first_and_drops_unknown_replicas():
    v = view("a", 3)  # master 1
    assert read_order(v, (1, 2, 3)) == [(2, "a:2"), (3, "a:3"), (1, "a:1")]
    assert read_order(v, (1, 9)) == [(1, "a:1")]


def test_broker_set_views_read_liveness_only_when_known():
    role = cpb.RoleAssignment(
        broker_set="a", has_master=True, master_id=2, master_address="h:2", sync_state_set=[2]
    )
    members = [
        cpb.MemberInfo(broker_id=2, address="h:2", alive=True),
        cpb.MemberInfo(broker_id=1, address="h:1"),
    ]
    reply = cpb.DescribeBrokerSetsReply(
        broker_sets=[cpb.BrokerSetInfo(role=role, members=members)], liveness_known=True
    )
    (v,) = broker_set_views(reply)
    assert (v.name, v.master_id, v.master_address, v.member_ids) == ("a", 2, "h:2", (1, 2))
    assert v.available == 1
    reply.liveness_known = False
    assert broker_set_views(reply)[0].available == 2


@pytest.mark.parametrize(
    ("err", "fence", "read"),
    [
        (UnauthorizedAccessError("x"), FenceOutcome.UNAUTHORIZED, ReadOutcome.UNAUTHORIZED),
        (UnavailableError("x"), FenceOutcome.TIMEOUT, ReadOutcome.TIMEOUT),
        (LedgerTimeoutError("x"), FenceOutcome.TIMEOUT, ReadOutcome.TIMEOUT),
        (NoSuchEntryError("x"), FenceOutcome.ERROR, ReadOutcome.NO_SUCH_ENTRY),
        # the replica cannot vouch for the ledger (lagging, lost to retention, wiped): never a "no"
        (LedgerReadError("x"), FenceOutcome.ERROR, ReadOutcome.ERROR),
        (NoSuchLedgerExistsError("x"), FenceOutcome.ERROR, ReadOutcome.ERROR),
        (DigestMatchError("x"), FenceOutcome.ERROR, ReadOutcome.ERROR),
        (NotMasterError("x"), FenceOutcome.ERROR, ReadOutcome.ERROR),
    ],
)
def test_error_outcomes(err, fence, read):
    assert fence_outcome(err) is fence
    assert read_outcome(err) is read


# --- an in-process broker set ---------------------------------------------------------------


def _proof(password: bytes | None) -> bytes | None:
    """What the controller's service puts in the command for a request carrying `password`."""
    return None if password is None else hash_password(password)


class FakeController:
    """The metadata calls of ControllerClient over the real ControllerState."""

    def __init__(self, sets: list[BrokerSetView]) -> None:
        self.state = ControllerState()
        self.sets = sets
        self.writes = 0

    def learn_brokers(self, addresses) -> None:
        """The broker addresses a real client would also ask while no controller answers."""
        self.learned = set(addresses)

    def _do(self, cmd: object):
        r = self.state.apply(cmd)
        if not r.ok:
            raise by_code(r.code)(r.message)
        self.writes += 1
        return r.value

    async def meta_get(self, key: str):
        e = self.state.get_meta(key)
        if e is None:
            raise MetadataNotFoundError(key)
        return e

    async def meta_create(self, key: str, value: bytes):
        return self._do(MetaCreate(key, value))

    async def meta_cas(
        self, key: str, value: bytes, expected_version: int, *, ledger_password: bytes | None = None
    ):
        return self._do(
            MetaCompareAndSet(key, value, expected_version, ledger_password_hash=_proof(ledger_password))
        )

    async def meta_delete(
        self, key: str, expected_version: int | None = None, *, ledger_password: bytes | None = None
    ) -> None:
        self._do(MetaDelete(key, expected_version, ledger_password_hash=_proof(ledger_password)))

    async def meta_list(self, prefix: str = ""):
        return self.state.list_prefix(prefix)

    async def describe_broker_sets(self, names=()):
        infos = []
        for v in self.sets:
            if names and v.name not in names:
                continue
            role = cpb.RoleAssignment(
                broker_set=v.name,
                has_master=v.master_id is not None,
                master_id=v.master_id or 0,
                master_address=v.master_address,
            )
            infos.append(
                cpb.BrokerSetInfo(
                    role=role,
                    members=[
                        cpb.MemberInfo(broker_id=m.broker_id, address=m.address, alive=m.alive)
                        for m in v.members
                    ],
                )
            )
        return cpb.DescribeBrokerSetsReply(broker_sets=infos, liveness_known=True)


@dataclass
class FakeReplica:
    broker_id: int
    entries: dict[int, lpb.Entry] = field(default_factory=dict)
    created: bool = False
    fenced: bool = False
    down: bool = False


class FakeSet:
    """One broker set `a` of `n` replicas, master 1. Adds store on every replica that is up;
    `fail` queues errors for (method, replica or entry id) keys; `hold` parks adds of an entry."""

    def __init__(self, n: int = 3) -> None:
        self.replicas = {i: FakeReplica(i) for i in range(1, n + 1)}
        self.view = view("a", n)
        self.master = 1
        self.master_lac = -1
        self.calls: list[tuple[str, int]] = []
        self.fail: dict[tuple[str, int], list[Exception]] = {}
        self.hold: dict[int, asyncio.Event] = {}
        self.batches: list[list[int]] = []  # the entry ids of each AddBatch call, in call order

    def _raise(self, key: tuple[str, int]) -> None:
        errs = self.fail.get(key)
        if errs:
            raise errs.pop(0)

    async def call(self, address: str, method: str, req, timeout: float):
        rid = int(address.split(":")[1])
        rep = self.replicas[rid]
        self.calls.append((method, rid))
        await asyncio.sleep(0)
        if rep.down:
            raise UnavailableError(f"replica {rid} is down")
        self._raise((method, rid))
        return await getattr(self, method.lower())(rep, req)

    async def create(self, rep, req):
        for r in self.replicas.values():
            r.created = True
        return lpb.CreateReply(broker_id=rep.broker_id)

    async def add(self, rep, req):
        if rep.broker_id != self.master:
            raise NotMasterError("not master")
        if req.entry_id in self.hold:
            await self.hold[req.entry_id].wait()
        self._raise(("Add", 100 + req.entry_id))
        if rep.fenced and not req.recovery:
            raise LedgerFencedError("fenced")
        holders = []
        for r in self.replicas.values():
            if not r.down and (req.recovery or not r.fenced):
                r.entries[req.entry_id] = lpb.Entry(
                    entry_id=req.entry_id, lac=req.lac, length=req.length, digest=req.digest, data=req.data
                )
                holders.append(r.broker_id)
        self.master_lac = max(self.master_lac, req.entry_id)
        return lpb.AddReply(entry_id=req.entry_id, replicas=holders, broker_id=rep.broker_id)

    async def addbatch(self, rep, req):
        """An AddBatch as the master answers it: every entry is checked (holds, queued errors,
        fencing) before any is stored, and the batch is answered as a whole."""
        if rep.broker_id != self.master:
            raise NotMasterError("not master")
        self.batches.append([e.entry_id for e in req.entries])
        for e in req.entries:
            if e.entry_id in self.hold:
                await self.hold[e.entry_id].wait()
            self._raise(("Add", 100 + e.entry_id))
        if rep.fenced:
            raise LedgerFencedError("fenced")
        holders = [r.broker_id for r in self.replicas.values() if not r.down and not r.fenced]
        for r in self.replicas.values():
            if r.broker_id in holders:
                for e in req.entries:
                    r.entries[e.entry_id] = lpb.Entry(
                        entry_id=e.entry_id, lac=e.lac, length=e.length, digest=e.digest, data=e.data
                    )
        self.master_lac = max(self.master_lac, req.entries[-1].entry_id)
        return lpb.AddBatchReply(
            first_entry_id=req.entries[0].entry_id,
            last_entry_id=req.entries[-1].entry_id,
            replicas=holders,
            broker_id=rep.broker_id,
        )

    def _lac(self, rep) -> tuple[int, int]:
        lac = (
            self.master_lac
            if rep.broker_id == self.master
            else max((e.lac for e in rep.entries.values()), default=-1)
        )
        return lac, rep.entries[lac].length if lac in rep.entries else 0

    async def close(self, rep, req):
        if rep.broker_id != self.master:
            raise NotMasterError("not master")
        self.sealed = getattr(self, "sealed", set()) | {req.ledger_id}
        return lpb.CloseReply(broker_id=rep.broker_id)

    async def fence(self, rep, req):
        rep.fenced = True
        lac, length = self._lac(rep)
        return lpb.FenceReply(lac=lac, length=length, broker_id=rep.broker_id)

    async def read(self, rep, req):
        if req.fence:
            rep.fenced = True
        out = []
        for i in range(req.first, req.last + 1):
            if i not in rep.entries:
                break
            out.append(rep.entries[i])
        if not out:
            raise NoSuchEntryError("never had it") if rep.created else LedgerReadError("no CREATE")
        return lpb.ReadReply(entries=out, lac=self._lac(rep)[0], broker_id=rep.broker_id)

    async def lac(self, rep, req):
        lac, length = self._lac(rep)
        return lpb.LacReply(
            lac=lac,
            length=length,
            fenced=rep.fenced,
            broker_id=rep.broker_id,
            is_master=rep.broker_id == self.master,
        )


async def no_data_port(address: str, op: int, parts: list[bytes], timeout: float) -> None:
    return None


def make(n: int = 3, *, add_timeout: float = 2.0) -> tuple[AsyncLedgers, FakeSet, FakeController]:
    fake = FakeSet(n)
    controller = FakeController([fake.view])
    # no data port: a batch of adds takes LedgerCalls.add_batch's gRPC path, into `fake.call`
    client = SimpleNamespace(controller=controller, rpc_timeout=1.0, over_data_port=no_data_port)
    ledgers = AsyncLedgers(client, add_timeout=add_timeout)  # type: ignore[arg-type]
    ledgers.call = fake.call  # type: ignore[method-assign]
    return ledgers, fake, controller


def run(coro):
    return asyncio.run(within(coro, 20))


# --- writer ---------------------------------------------------------------------------------


def test_create_takes_sequential_ids_and_stores_metadata_before_create():
    async def go():
        ledgers, fake, controller = make()
        a = await ledgers.create_ledger(3, 3, 2, PW)
        b = await ledgers.create_ledger(3, 3, 2, PW, digest="crc32")
        assert (a.ledger_id, b.ledger_id) == (0, 1)
        assert await ledgers.list_ledgers() == [0, 1]
        meta = await ledgers.get_metadata(1)
        assert (meta.broker_set, meta.replicas, meta.ack_quorum, meta.state) == (
            "a",
            (1, 2, 3),
            2,
            LedgerState.OPEN,
        )
        assert ("Create", 1) in fake.calls

    run(go())


def test_bad_create_writes_nothing():
    async def go():
        ledgers, fake, controller = make()
        for args, kw in [
            ((3, 3, 4, PW), {}),
            ((2, 2, 2, PW), {}),
            ((3, 3, 2, None), {}),
            ((3, 3, 2, PW), {"digest": "md5"}),
            ((3, 3, 2, PW), {"custom_metadata": {"k": "str"}}),
        ]:
            with pytest.raises(IncorrectParameterError):
                await ledgers.create_ledger(*args, **kw)
        assert controller.writes == 0 and fake.calls == []

    run(go())


def test_a_failed_create_deletes_its_metadata():
    async def go():
        ledgers, fake, controller = make()
        fake.fail[("Create", 1)] = [IncorrectParameterError("refused")]
        with pytest.raises(IncorrectParameterError):
            await ledgers.create_ledger(3, 3, 2, PW)
        assert await ledgers.list_ledgers() == []

    run(go())


async def one_call_each(w, n: int) -> list[asyncio.Future[int]]:
    """`n` adds, each in its own turn of the loop: while a request slot is free an add goes in a
    call of its own (ledger/writer.py), so the first ones are separate calls, as these tests need."""
    futures = []
    for i in range(n):
        futures.append(w.add_entry_async(b"e%d" % i))
        await asyncio.sleep(0)
    return futures


def test_adds_complete_in_id_order_even_when_answers_come_out_of_order():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.hold[0] = asyncio.Event()
        done: list[int] = []
        futures = await one_call_each(w, 5)
        for f in futures:
            f.add_done_callback(lambda f: done.append(f.result()))
        await asyncio.sleep(0.05)
        assert done == [] and w.last_add_confirmed == -1 and w.last_add_pushed == 4
        fake.hold[0].set()
        assert await asyncio.gather(*futures) == [0, 1, 2, 3, 4]
        assert done == [0, 1, 2, 3, 4]
        assert fake.batches[:2] == [[0], [1]]  # entry 1's answer came first, and waited for 0
        assert w.last_add_confirmed == 4 and w.length == 10
        # the LAC each entry carries is the writer's LAC when it was sent; digests verify
        d = Digester("crc32c", PW)
        for e in fake.replicas[2].entries.values():
            d.verify(0, e.entry_id, e.lac, e.length, e.data, e.digest)

    run(go())


def test_not_master_and_unavailable_are_retried_on_the_same_entry_id():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.fail[("Add", 100)] = [NotMasterError("moved"), UnavailableError("blip")]
        assert await w.add_entry(b"x") == 0
        assert sorted(fake.replicas[3].entries) == [0]

    run(go())


def test_fenced_answer_fails_every_pending_add_then_later_adds_are_closed():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        assert await w.add_entry(b"ok") == 0
        fake.replicas[1].fenced = True
        futures = [w.add_entry_async(b"p%d" % i) for i in range(3)]
        for f in futures:
            with pytest.raises(LedgerFencedError) as info:
                await f
            assert info.value.number == -101
        with pytest.raises(LedgerClosedError):
            await w.add_entry(b"later")
        assert w.last_add_confirmed == 0

    run(go())


def test_a_failed_add_fails_it_and_every_later_one_but_not_earlier_ones():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.hold[0] = asyncio.Event()
        # refused while entry 0 is still pending: sent again once 0 is through, and refused again
        fake.fail[("Add", 101)] = [UnauthorizedAccessError("no"), UnauthorizedAccessError("no")]
        futures = await one_call_each(w, 4)
        await asyncio.sleep(0.05)
        fake.hold[0].set()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert results[0] == 0
        assert all(isinstance(r, UnauthorizedAccessError) for r in results[1:])
        with pytest.raises(LedgerClosedError):
            w.add_entry_async(b"refused")
        assert w.last_add_confirmed == 0

    run(go())


def test_an_add_refused_while_an_earlier_one_is_pending_is_sent_again():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.hold[0] = asyncio.Event()
        fake.fail[("Add", 101)] = [IncorrectParameterError("entry 0 failed here; retry from it")]
        futures = await one_call_each(w, 3)
        await asyncio.sleep(0.05)
        fake.hold[0].set()
        assert await asyncio.gather(*futures) == [0, 1, 2]

    run(go())


def test_an_add_that_never_gets_through_times_out():
    async def go():
        ledgers, fake, _ = make(add_timeout=0.3)
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.fail[("Add", 100)] = [UnavailableError("down")] * 1000
        with pytest.raises(LedgerTimeoutError):
            await w.add_entry(b"x")

    run(go())


def test_close_seals_at_the_lac_and_fails_pending_adds():
    async def go():
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        await w.add_entry(b"abc")
        fake.hold[1] = asyncio.Event()
        pending = w.add_entry_async(b"never")
        await asyncio.sleep(0.01)
        await w.close()
        with pytest.raises(LedgerClosedError):
            await pending
        meta = await ledgers.get_metadata(w.ledger_id)
        assert (meta.state, meta.last_entry_id, meta.length) == (LedgerState.CLOSED, 0, 3)
        assert fake.calls[-1] == ("Close", fake.master) and w.ledger_id in fake.sealed, (
            "sealed on the brokers too"
        )
        await w.close()  # again: harmless

    run(go())


def test_close_over_a_recovery_fails_fenced_and_over_another_end_fails_version():
    async def go():
        ledgers, fake, controller = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        await w.add_entry(b"abc")
        meta = await ledgers.get_metadata(w.ledger_id)
        from dataclasses import replace

        await controller.meta_cas(
            ledger_key(0),
            replace(meta, state=LedgerState.IN_RECOVERY).encode(),
            meta.version,
            ledger_password=PW,
        )
        with pytest.raises(LedgerFencedError):
            await w.close()

        w2 = await ledgers.create_ledger(3, 3, 2, PW)
        await w2.add_entry(b"abc")
        m2 = await ledgers.get_metadata(w2.ledger_id)
        closed = replace(m2, state=LedgerState.CLOSED, last_entry_id=-1, length=0)
        await controller.meta_cas(ledger_key(1), closed.encode(), m2.version, ledger_password=PW)
        with pytest.raises(MetadataVersionError):
            await w2.close()

    run(go())


# --- opens, recovery, reads -----------------------------------------------------------------


async def written(n_entries: int, *, aq: int = 2, n: int = 3):
    ledgers, fake, controller = make(n)
    w = await ledgers.create_ledger(n, n, aq, PW)
    for i in range(n_entries):
        await w.add_entry(b"entry-%d" % i)
    return ledgers, fake, controller, w


def test_wrong_password_is_refused_before_anything_is_sent():
    async def go():
        ledgers, fake, controller, w = await written(3)
        fake.calls.clear()
        writes = controller.writes
        for recovery in (True, False):
            with pytest.raises(UnauthorizedAccessError):
                await ledgers.open_ledger(w.ledger_id, b"wrong", recovery=recovery)
        with pytest.raises(DigestMatchError):
            await ledgers.open_ledger(w.ledger_id, PW, digest="mac")
        assert fake.calls == [] and controller.writes == writes
        assert not any(r.fenced for r in fake.replicas.values())
        with pytest.raises(NoSuchLedgerExistsError):
            await ledgers.open_ledger(99, PW)
        with pytest.raises(NoSuchLedgerExistsError):
            await ledgers.open_ledger(-1, PW)

    run(go())


def test_recovery_closes_at_the_last_entry_and_fences_the_writer():
    async def go():
        ledgers, fake, controller, w = await written(5)
        r = await ledgers.open_ledger(w.ledger_id, PW)
        assert r.is_closed and r.last_add_confirmed == 4
        assert [e.data for e in await r.read_entries(0, 4)] == [b"entry-%d" % i for i in range(5)]
        assert all(rep.fenced for rep in fake.replicas.values())
        with pytest.raises(LedgerFencedError):
            await w.add_entry(b"late")
        # a CLOSED ledger: no CAS, no fence
        fake.calls.clear()
        writes = controller.writes
        again = await ledgers.open_ledger(w.ledger_id, PW)
        assert again.last_add_confirmed == 4 and fake.calls == [] and controller.writes == writes

    run(go())


def test_recovery_rewrites_an_entry_only_one_replica_holds():
    async def go():
        ledgers, fake, controller, w = await written(3, aq=1)
        # entry 3 reached replica 3 alone (the writer died before more): recoverable, rewritten
        d = Digester("crc32c", PW)
        e3 = lpb.Entry(entry_id=3, lac=2, length=fake.replicas[3].entries[2].length + 2, data=b"e3")
        e3.digest = d.compute(0, 3, 2, e3.length, e3.data)
        fake.replicas[3].entries[3] = e3
        r = await ledgers.open_ledger(w.ledger_id, PW)
        assert r.last_add_confirmed == 3 and r.length == e3.length
        assert all(3 in rep.entries for rep in fake.replicas.values())

    run(go())


def test_recovery_looks_up_the_replicas_once_while_the_in_recovery_cas_is_out():
    async def go():
        ledgers, fake, controller, w = await written(3)
        lookups: list[object] = []
        looked_up = asyncio.Event()
        describe, cas = controller.describe_broker_sets, controller.meta_cas

        async def counted_describe(names=()):
            lookups.append(names)
            looked_up.set()
            return await describe(names)

        async def cas_after_the_lookup(*args, **kwargs):
            # the mark CAS answers only once the addresses were asked for: a lookup that waits
            # for the CAS (one more controller round trip in a row) never gets there
            await within(looked_up.wait(), 2.0)
            return await cas(*args, **kwargs)

        controller.describe_broker_sets = counted_describe
        controller.meta_cas = cas_after_the_lookup
        r = await ledgers.open_ledger(w.ledger_id, PW)
        assert r.is_closed and r.last_add_confirmed == 2
        # one lookup for three fences and every read, not one per replica
        assert len(lookups) == 1

    run(go())


def test_recovery_reads_the_entry_past_the_lac_and_the_next_in_one_round():
    async def go():
        ledgers, fake, controller, w = await written(5)
        # the writer died after entry 4 was acknowledged but before a later entry carried LAC 4
        # (the master lost its own count in a restart): every replica answers the fence with 3
        fake.master_lac = 3
        sent: list[tuple[str, int]] = []
        call = fake.call

        async def recorded(address, method, req, timeout):
            sent.append((method, req.first if method == "Read" else getattr(req, "entry_id", -1)))
            return await call(address, method, req, timeout)

        ledgers.call = recorded  # type: ignore[method-assign]
        r = await ledgers.open_ledger(w.ledger_id, PW)
        assert r.is_closed and r.last_add_confirmed == 4
        # entry 5 (absent) was asked together with entry 4, not after entry 4 was decided and
        # rewritten: the dead writer's end costs one round of reads
        assert sent.index(("Read", 5)) < sent.index(("Add", 4))

    run(go())


def test_an_unknown_aborts_recovery_retryably_and_never_closes_short():
    async def go():
        ledgers, fake, controller, w = await written(3, aq=2)
        # replicas 2 and 3 cannot vouch for entry 3 (no CREATE record): unknown, not "no such entry"
        for rid in (2, 3):
            fake.replicas[rid].created = False
        fake.replicas[1].down = True
        with pytest.raises(LedgerRecoveryError) as info:
            await ledgers.open_ledger(w.ledger_id, PW)
        assert info.value.retryable
        assert (await ledgers.get_metadata(w.ledger_id)).state is LedgerState.IN_RECOVERY
        fake.replicas[1].down = False
        for rid in (2, 3):
            fake.replicas[rid].created = True
        r = await ledgers.open_ledger(w.ledger_id, PW)  # the retry continues from IN_RECOVERY
        assert r.last_add_confirmed == 2

    run(go())


def test_plain_open_reads_to_the_exact_lac_and_tails():
    async def go():
        ledgers, fake, controller, w = await written(3)
        r = await ledgers.open_ledger(w.ledger_id, PW, recovery=False)
        assert r.last_add_confirmed == 2 and not r.is_closed  # the master's exact LAC, no lag
        assert not any(rep.fenced for rep in fake.replicas.values())
        with pytest.raises(LedgerReadError) as info:
            await r.read_entries(0, 3)
        assert info.value.number == -1
        assert await r.wait_for_lac(2, 0.01) == 2
        await w.add_entry(b"entry-3")
        assert await r.wait_for_lac(2, 1.0) == 3
        assert (await r.read_entries(3, 3))[0].data == b"entry-3"
        with pytest.raises(NoSuchEntryError):
            await r.read_unconfirmed_entries(3, 9)

    run(go())


def test_reads_skip_a_replica_with_a_corrupt_entry():
    async def go():
        ledgers, fake, controller, w = await written(3)
        bad = fake.replicas[2].entries[1]
        fake.replicas[2].entries[1] = lpb.Entry(
            entry_id=1, lac=bad.lac, length=bad.length, digest=bad.digest, data=b"entry-X"
        )
        fake.replicas[3].down = True
        r = await ledgers.open_ledger(w.ledger_id, PW, recovery=False)
        got = await r.read_entries(0, 2)  # replica 2 first (a slave), then the master for the rest
        assert [e.data for e in got] == [b"entry-0", b"entry-1", b"entry-2"]
        fake.replicas[1].down = True
        with pytest.raises(DigestMatchError):
            await r.read_entries(1, 1)

    run(go())


def test_delete_and_bad_ids():
    async def go():
        ledgers, fake, controller, w = await written(1)
        with pytest.raises(IncorrectParameterError):
            await ledgers.delete_ledger(-1, PW)
        with pytest.raises(
            UnauthorizedAccessError
        ):  # the controller deletes ledger metadata only with the password
            await ledgers.delete_ledger(w.ledger_id, b"not-" + PW)
        with pytest.raises(IncorrectParameterError):
            await ledgers.delete_ledger(w.ledger_id, None)  # type: ignore[arg-type]
        assert await ledgers.list_ledgers() == [w.ledger_id]
        await ledgers.delete_ledger(w.ledger_id, PW)
        with pytest.raises(NoSuchLedgerExistsError):
            await ledgers.delete_ledger(w.ledger_id, PW)
        with pytest.raises(NoSuchLedgerExistsError):
            await ledgers.get_metadata(w.ledger_id)
        assert await ledgers.list_ledgers() == []
        # the id is never handed out again
        assert (await ledgers.create_ledger(3, 3, 2, PW)).ledger_id == 1

    run(go())


def test_metadata_decodes_with_its_store_version():
    async def go():
        ledgers, fake, controller, w = await written(0)
        meta = await ledgers.get_metadata(w.ledger_id)
        assert isinstance(meta, LedgerMetadata) and meta.version == 1

    run(go())
