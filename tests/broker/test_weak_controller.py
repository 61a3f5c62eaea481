"""The data plane without the controllers: brokers answer route lookups from the cluster view
their heartbeats bring, clients started while no controller answers find masters through them,
and what needs a controller quorum answers CONTROLLER_UNAVAILABLE within seconds
(docs/ARCHITECTURE.md §7.5).

Each test pauses (SIGSTOP) every controller, waits until the brokers have noticed (their Status
says how long ago a controller last answered), and resumes the controllers before it ends. One
cluster serves the module: each test starts once it is whole again (a master, both replicas in
its SyncStateSet, every broker hearing from a controller) and works on a topic of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.broker.conftest import QUEUES, SET, BrokerCluster
from tests.brokers import (
    BrokerSetProcs,
    _typed,
    create_topic,
    pause,
    read_queues,
    resume,
    status_of,
    wait_topic,
)
from tests.procs import ControllerCluster, wait_until
from tidelog.client import Client
from tidelog.errors import ControllerUnavailableError, TopicNotFoundError
from tidelog.proto import controller_pb2 as cpb
from tidelog.proto import controller_pb2_grpc as cpb_grpc
from tidelog.spark import fetch

pytestmark = pytest.mark.slow

SILENT_MS = 1500  # the brokers have heard from no controller for this long: the outage is seen
HEARD_MS = 1000  # every broker has heard from a controller this recently: they are back
_TOPICS = itertools.count(1)


@dataclass
class Weak:
    cluster: BrokerCluster
    topic: str  # the test's own, `QUEUES` queues on broker-a


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    """One controller and broker set broker-a of two replicas (`flush: sync`) for the module."""
    root: Path = tmp_path_factory.mktemp("weak")
    (root / "controllers").mkdir()
    cc = ControllerCluster(root / "controllers", 1)
    bs = BrokerSetProcs(root, SET, 2, cc.address_list, flush="sync")
    try:
        cc.start()
        bs.start()
        yield BrokerCluster(cc, bs)
    finally:
        for p in [*bs.procs, *cc.procs.values()]:
            resume(p)  # a test that failed inside its outage
        bs.stop()
        cc.stop()


@pytest.fixture
def weak(shared: BrokerCluster, request: pytest.FixtureRequest) -> Iterator[Weak]:
    """The module's cluster once it is whole again after the previous test's outage, and a topic
    of this test's own (bodies and groups of one test never meet another's)."""
    bs = shared.bs
    bs.wait_master(timeout=30)
    bs.wait_in_sync(2, timeout=30)
    for i in range(len(bs.procs)):
        wait_until(
            lambda i=i: (s := status_of(bs, i)) is not None and s.controller_heard_ms_ago < HEARD_MS,
            30,
            what=f"broker {i} to hear from a controller again",
        )
    topic = f"t{next(_TOPICS)}"
    create_topic(shared.controllers, topic, {SET: QUEUES})
    wait_topic(bs, topic)
    yield Weak(shared, topic)
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        print(bs.logs())
        print(shared.cc.logs())


def route_from(address: str, topic: str) -> cpb.GetRouteReply:
    with grpc.insecure_channel(address) as channel:
        try:
            return cpb_grpc.ControllerRouteStub(channel).GetRoute(cpb.GetRouteRequest(topic=topic), timeout=2)
        except grpc.RpcError as exc:
            raise _typed(exc) from None


@contextlib.contextmanager
def controllers_down(cluster: BrokerCluster) -> Iterator[None]:
    """Every controller paused until the block ends, once every broker has noticed."""
    procs = list(cluster.cc.procs.values())
    for p in procs:
        pause(p)
    try:
        for i in range(len(cluster.bs.procs)):
            wait_until(
                lambda i=i: (
                    (s := status_of(cluster.bs, i)) is not None and s.controller_heard_ms_ago > SILENT_MS
                ),
                15,
                what=f"broker {i} to notice the controllers' silence",
            )
        yield
    finally:
        for p in procs:
            resume(p)


def test_a_broker_answers_routes_with_their_age(weak: Weak) -> None:
    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    m = bs.wait_master()
    wait_until(lambda: route_from(bs.addresses[1 - m], topic).broker_sets, 10, what="a broker's view")
    reply = route_from(bs.addresses[1 - m], topic)
    assert reply.from_broker and 0 <= reply.metadata_age_ms < 5000
    (route,) = reply.broker_sets
    assert route.queues == QUEUES and route.role.has_master
    assert route.role.master_address == bs.addresses[m]
    assert sorted(r.address for r in route.replicas) == sorted(bs.addresses)
    with pytest.raises(TopicNotFoundError):
        route_from(bs.addresses[m], "no-such-topic")
    with controllers_down(cluster):
        stale = route_from(bs.addresses[m], topic)
        assert stale.metadata_age_ms > SILENT_MS
        assert stale.broker_sets[0].role.master_address == bs.addresses[m]


def test_a_producer_started_during_the_outage_sends_through_a_broker(weak: Weak) -> None:
    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    m = bs.wait_master()
    wait_until(lambda: route_from(bs.addresses[m], topic).broker_sets, 10, what="a broker's view")
    bootstrap = f"{cluster.controllers},{bs.addresses[1 - m]}"
    with controllers_down(cluster), Client(bootstrap, send_timeout=20) as client:
        receipts = [client.producer().send(topic, b"during-%d" % i) for i in range(20)]
        assert {r.broker_set for r in receipts} == {"broker-a"}
        # readers started now read them back, through the slave the bootstrap list names
        readers = [client.reader(topic, q) for q in range(QUEUES)]
        got: list[bytes] = []

        def read_all() -> bool:
            for r in readers:
                got.extend(msg.body for msg in r.read(max_messages=100, timeout=0.1))
            return len(got) >= 20

        wait_until(read_all, 15, what="the readers to read what was sent")
        # a Spark batch read plans from the same broker: every queue's confirmed offsets
        view = fetch.run(lambda c: fetch.cluster_view(c, [topic]), bs.addresses[1 - m])
        assert sum(q.confirmed - q.min for q in view.states) >= 20
    assert sorted(got) == sorted(b"during-%d" % i for i in range(20))
    stored = {b for q in read_queues(bs.clients[m], topic, QUEUES).values() for b in q}
    assert {b"during-%d" % i for i in range(20)} <= stored


def test_a_running_producer_keeps_being_acknowledged(weak: Weak) -> None:
    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    with Client(cluster.controllers, send_timeout=10) as client:
        producer = client.producer()

        def run() -> None:
            i = 0
            while not stop.is_set():
                body = b"run-%d" % i
                i += 1
                try:
                    producer.send(topic, body)
                    acked.append(body)
                except Exception as exc:
                    failed.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_until(lambda: len(acked) >= 20, 10, what="the producer to run")
            with controllers_down(cluster):
                before = len(acked)
                wait_until(lambda: len(acked) >= before + 50, 15, what="acks during the outage")
            after = len(acked)
            wait_until(lambda: len(acked) >= after + 20, 15, what="acks after the outage")
        finally:
            stop.set()
            thread.join(30)
    assert not failed, failed[:3]
    m = bs.wait_master()
    stored = {b for q in read_queues(bs.clients[m], topic, QUEUES).values() for b in q}
    assert set(acked) <= stored


def test_a_topic_create_during_the_outage_is_refused_within_seconds(weak: Weak) -> None:
    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    m = bs.wait_master()
    wait_until(lambda: route_from(bs.addresses[m], topic).broker_sets, 10, what="a broker's view")

    def refused(bootstrap: str) -> tuple[ControllerUnavailableError, float]:
        with Client(bootstrap) as client:
            started = time.monotonic()
            with pytest.raises(ControllerUnavailableError) as err:
                client.admin().create_topic("new-topic", queues=2)
            return err.value, time.monotonic() - started

    with controllers_down(cluster):
        # from either address, each on a client of its own: both at once (each waits seconds)
        bootstraps = (cluster.controllers, bs.addresses[m])
        with ThreadPoolExecutor(len(bootstraps)) as pool:
            answers = list(pool.map(refused, bootstraps))
        for bootstrap, (err, took) in zip(bootstraps, answers, strict=True):
            assert err.retryable and err.code == "CONTROLLER_UNAVAILABLE"
            assert took < 12, f"{bootstrap}: CONTROLLER_UNAVAILABLE after {took:.1f} s"
    # once they are back, the same create goes through a broker's address (it names the leader)
    with Client(bs.addresses[m]) as client:
        wait_until(
            lambda: _created(client, "new-topic"),
            20,
            what="the topic create to go through once the controllers are back",
        )


def _created(client: Client, name: str) -> bool:
    try:
        client.admin().create_topic(name, queues=2)
    except ControllerUnavailableError:
        return False
    return True


def test_group_members_read_through_the_outage(weak: Weak) -> None:
    """A member holding queues reads on (nobody can take them over while the controllers are away);
    a shared member started during the outage, with only a broker's address, receives at once."""
    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    m = bs.wait_master()
    wait_until(lambda: route_from(bs.addresses[m], topic).broker_sets, 10, what="a broker's view")
    with Client(cluster.controllers) as client:
        producer = client.producer()
        for i in range(20):
            producer.send(topic, b"before-%d" % i)
        member = client.consumer(group="g", topic=topic)
        seen: list[bytes] = []

        def poll_until(n: int) -> bool:
            seen.extend(msg.body for msg in member.poll(max_messages=100, timeout=0.2))
            return len(seen) >= n

        try:
            wait_until(lambda: poll_until(20), 20, what="the member to read what was sent before")
            with controllers_down(cluster):
                for i in range(20):
                    producer.send(topic, b"during-%d" % i)
                wait_until(lambda: poll_until(40), 20, what="the member to read on during the outage")
                with Client(bs.addresses[1 - m]) as late:
                    shared = late.consumer(group="s", topic=topic, mode="shared")
                    got: list[Any] = []
                    try:
                        wait_until(
                            lambda: got.extend(shared.poll(max_messages=100, timeout=0.2)) or len(got) >= 40,
                            20,
                            what="a shared member started during the outage to receive",
                        )
                        shared.ack_all(got)
                    finally:
                        shared.close()
        finally:
            member.close()
    assert sorted(seen) == sorted(
        [b"before-%d" % i for i in range(20)] + [b"during-%d" % i for i in range(20)]
    )
    assert sorted(msg.body for msg in got) == sorted(seen)


def test_ledger_adds_go_on_and_what_needs_metadata_waits(weak: Weak, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds to an open ledger need no controller (the writer and the broker set know its metadata);
    a create and a close answer CONTROLLER_UNAVAILABLE, and the close succeeds once they are back."""
    from tidelog.ledger import Ledgers
    from tidelog.ledger.placement import BrokerSetView

    cluster, topic = weak.cluster, weak.topic
    bs = cluster.bs
    m = bs.wait_master()
    wait_until(lambda: route_from(bs.addresses[m], topic).broker_sets, 10, what="a broker's view")
    with Client(cluster.controllers) as client:
        ledgers = Ledgers(client)
        calls = ledgers.aio
        # The writer's cached view of the set lives `set_ttl` (5 s): 1 s here, so that it runs out
        # early in the outage. What is proven is the view re-read from a broker, not how long it lives.
        calls.set_ttl = 1.0
        refreshed: list[int] = []  # each view of the set read: the age of its answer (0: a controller's)
        remember = calls.remember_set

        def noting(view: BrokerSetView) -> None:
            refreshed.append(calls.controller.last_lookup_age_ms)
            remember(view)

        monkeypatch.setattr(calls, "remember_set", noting)
        w = ledgers.create_ledger(2, 2, 2, b"pw")
        assert w.add_entry(b"before") == 0
        with controllers_down(cluster):
            refreshed.clear()
            ids: list[int] = []
            after = 0  # adds once the view was re-read from a broker twice
            deadline = time.monotonic() + 20
            while after < 5 and time.monotonic() < deadline:
                ids.append(w.add_entry(b"during-%d" % len(ids)))
                after += sum(age > 0 for age in refreshed) >= 2
            # the writer's view ran out twice and was read from a broker, and the adds went on
            assert sum(age > 0 for age in refreshed) >= 2 and after == 5, (refreshed, len(ids))
            assert ids == list(range(1, len(ids) + 1))
            with pytest.raises(ControllerUnavailableError):
                ledgers.create_ledger(2, 2, 2, b"pw")
            with pytest.raises(ControllerUnavailableError):
                w.close()
        wait_until(lambda: _closed(w), 30, what="the close to go through once the controllers are back")
        r = ledgers.open_ledger(w.ledger_id, b"pw")
        assert r.last_add_confirmed == len(ids)
        assert [e.data for e in r.read_entries(0, r.last_add_confirmed)] == [b"before"] + [
            b"during-%d" % i for i in range(len(ids))
        ]


def _closed(w: Any) -> bool:
    try:
        w.close()
    except ControllerUnavailableError:
        return False
    return True
