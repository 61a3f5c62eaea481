"""Scenario: a cluster of deploy/secure.yaml (TLS, `auth: {enabled: true}`) started by `tide
cluster up`, which creates an admin user and prints its credentials.

Users and grants are managed under the admin's credentials: with the CLI in
`test_cli_manages_users_and_grants` (every `tide user`/`tide acl` command, end to end), and with the
same controller calls in-process everywhere else (a `tide` process costs about a second of CPU to
start, and the other tests are about what the brokers enforce, not the command line). Every refusal is checked for what it left behind: a refused produce stored nothing (read back by
the admin), a refused fence left the ledger open. Calls without credentials, with a wrong
secret, or an unsigned data-port connection are UNAUTHENTICATED; a known user lacking a
permission gets PERMISSION_DENIED naming it, and never learns whether the resource exists.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.client.conftest import REPO, LocalCluster, start_cluster, stop_cluster, tide
from tidelog import access, tlsconfig
from tidelog import dataport_frames as df
from tidelog.client import AsyncClient
from tidelog.client.dataconn import DataConnection
from tidelog.credentials import Credentials, Signer, new_credentials
from tidelog.errors import PermissionDeniedError, UnauthenticatedError
from tidelog.ledger import AsyncLedgers, LedgerState
from tidelog.localcluster import client_tls
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto.rocketmq import definition_pb2 as rmq_d
from tidelog.proto.rocketmq import service_pb2 as rmq
from tidelog.proto.rocketmq import service_pb2_grpc as rmq_grpc

pytestmark = pytest.mark.slow

SECURE = REPO / "deploy" / "secure.yaml"
PASSWORD = b"auth-ledger"
T = TypeVar("T")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("auth"), SECURE)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(autouse=True)
def no_cluster_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients here are users: the test session's $TIDE_CLUSTER_SECRET (another cluster's)
    would sign their user-management calls as a member, and be refused."""
    monkeypatch.delenv("TIDE_CLUSTER_SECRET", raising=False)


def admin_env(c: LocalCluster) -> dict[str, str]:
    creds = c.up_doc["credentials"]
    return {
        "TIDE_CONTROLLERS": c.controllers,
        "TIDE_CA_FILE": c.up_doc["ca_file"],
        "TIDE_ACCESS_KEY": creds["access_key"],
        "TIDE_SECRET_KEY": creds["secret_key"],
        "TIDE_CONTROLLER_TIMEOUT": "10",
    }


def cli(c: LocalCluster, *args: str) -> Any:
    out = tide(*args, "--json", env=admin_env(c), timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def new_users(
    c: LocalCluster, wanted: dict[str, tuple[tuple[str, str, str], ...]]
) -> dict[str, dict[str, str]]:
    """Each user of `wanted` with its grants, made as `tide user create` and `tide acl grant` make
    them (their controller calls, signed by the admin), in this process. A user change answers
    once the brokers enforce it (up to two heartbeat intervals), so the users are created side by
    side, then all the grants side by side: two rounds of that wait rather than one a call."""
    creds = {name: new_credentials() for name in wanted}

    async def make(client: AsyncClient) -> None:
        await asyncio.gather(
            *(client.controller.create_user(name, k.access_key, k.signing_key) for name, k in creds.items())
        )
        await asyncio.gather(
            *(
                client.controller.grant_acl(name, kind, resource, permission)
                for name, grants in wanted.items()
                for kind, resource, permission in grants
            )
        )

    run(c, admin(c), make)
    return {
        name: {"name": name, "access_key": k.access_key, "secret_key": k.secret_key}
        for name, k in creds.items()
    }


def grant(
    c: LocalCluster, user: str, kind: str, resource: str, permission: str, revoke: bool = False
) -> None:
    """`tide acl grant|revoke` in this process: the same controller call, signed by the admin."""

    async def call(client: AsyncClient) -> None:
        change = client.controller.revoke_acl if revoke else client.controller.grant_acl
        await change(user, kind, resource, permission)

    run(c, admin(c), call)


def run(c: LocalCluster, creds: dict[str, str] | None, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def go() -> T:
        keys = {"access_key": creds["access_key"], "secret_key": creds["secret_key"]} if creds else {}
        async with AsyncClient(
            c.controllers, ca_file=c.up_doc["ca_file"], send_timeout=8.0, rpc_timeout=5.0, **keys
        ) as client:
            client.controller.total_timeout = 8.0
            return await work(client)

    return asyncio.run(go())


def admin(c: LocalCluster) -> dict[str, str]:
    return dict(c.up_doc["credentials"])


def stored(c: LocalCluster, topic: str) -> int:
    """How many messages `topic` holds, as the admin reads it."""

    async def count(client: AsyncClient) -> int:
        return sum(q["max"] - q["min"] for q in await client.admin().describe_topic(topic))

    return run(c, admin(c), count)


def produce(topic: str, n: int = 3) -> Callable[[AsyncClient], Awaitable[int]]:
    async def work(client: AsyncClient) -> int:
        producer = client.producer()
        for i in range(n):
            await producer.send(topic, b"m%d" % i)
        return n

    return work


def consume(topic: str, queue: int = 0) -> Callable[[AsyncClient], Awaitable[int]]:
    async def work(client: AsyncClient) -> int:
        return len(await client.reader(topic, queue).read(100))

    return work


def until_raises(
    what: str, attempt: Callable[[], object], error: type[Exception], within_s: float = 15.0
) -> None:
    """`attempt` raises `error` within `within_s` (a grant change reaches the brokers on their next heartbeat)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            attempt()
        except error:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still allowed after {within_s:.0f}s")
        time.sleep(0.3)


def until_passes(what: str, attempt: Callable[[], T], within_s: float = 15.0) -> T:
    """`attempt`'s result once it passes: a new user or grant reaches the brokers on their next
    heartbeat (until then a new user is unknown there: UNAUTHENTICATED)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return attempt()
        except (PermissionDeniedError, UnauthenticatedError):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still refused after {within_s:.0f}s") from None
            time.sleep(0.3)


def refusal(what: str, attempt: Callable[[], object], expected: str, within_s: float = 15.0) -> None:
    """`attempt` ends with PERMISSION_DENIED naming `expected`, once the brokers know the (new) user
    and its grants (until then a broker may not know the user, or refuse for a grant still coming)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            attempt()
        except PermissionDeniedError as exc:
            if expected in exc.message:
                return
            assert time.monotonic() < deadline, f"{what}: {exc.message}"
        except UnauthenticatedError:
            assert time.monotonic() < deadline, f"{what}: the user stayed unknown"
        else:
            raise AssertionError(f"{what}: allowed")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def topics(secured: LocalCluster) -> tuple[str, str]:
    cli(secured, "topic", "create", "auth-a", "--queues", "1")
    cli(secured, "topic", "create", "auth-b", "--queues", "1")
    return "auth-a", "auth-b"


@pytest.fixture(scope="module")
def users(secured: LocalCluster, topics: tuple[str, str]) -> dict[str, dict[str, str]]:
    """The users the tests act as, one (or a few) a test, each with the grants its test starts
    from; a test changes only its own users' grants."""
    a, _ = topics
    wanted: dict[str, tuple[tuple[str, str, str], ...]] = {
        "alice": (("topic", a, "produce"),),
        "bob": (),
        "erin": (("topic", a, "consume"),),
        "gina": (("topic", a, "consume"), ("group", "gina-*", "consume")),
        "dave": (("topic", "other", "consume"),),
        "frank": (("topic", a, "produce"),),
        "lwriter": (("ledger", "*", "create"), ("ledger", "*", "write")),
        "lreader": (("ledger", "*", "read"),),
        "lfencer": (("ledger", "*", "read"), ("ledger", "*", "fence")),
        "lnobody": (("topic", "*", "produce"),),
        "lcreator": (("ledger", "*", "create"),),
    }
    with pytest.MonkeyPatch.context() as mp:  # as `no_cluster_secret` does, which runs per test
        mp.delenv("TIDE_CLUSTER_SECRET", raising=False)
        return new_users(secured, wanted)


def test_up_prints_the_admin_credentials_and_the_admin_may_do_everything(
    secured: LocalCluster, topics: tuple[str, str]
) -> None:
    creds = secured.up_doc["credentials"]
    assert set(creds) == {"access_key", "secret_key"}
    state = json.loads((secured.data_dir / "cluster.json").read_text())
    assert state["credentials"] == creds  # `tide` commands against the cluster find them
    before = stored(secured, "auth-a")
    assert run(secured, admin(secured), produce("auth-a", 4)) == 4
    assert stored(secured, "auth-a") == before + 4
    assert run(secured, admin(secured), consume("auth-a")) == before + 4


def test_a_client_without_credentials_or_with_a_wrong_secret_is_unauthenticated(
    secured: LocalCluster, topics: tuple[str, str]
) -> None:
    before = stored(secured, "auth-a")
    with pytest.raises(UnauthenticatedError):
        run(secured, None, produce("auth-a", 1))
    wrong = {"access_key": admin(secured)["access_key"], "secret_key": "not-the-secret"}
    with pytest.raises(UnauthenticatedError):
        run(secured, wrong, produce("auth-a", 1))
    with pytest.raises(UnauthenticatedError):
        run(secured, wrong, lambda client: client.admin().create_topic("never-made", queues=1))
    assert stored(secured, "auth-a") == before
    assert "never-made" not in [t["name"] for t in cli(secured, "topic", "list")]
    # the CLI says the same without credentials in its environment
    env = {k: v for k, v in admin_env(secured).items() if "KEY" not in k}
    out = tide("topic", "list", env=env, timeout=60)
    assert out.returncode != 0 and "UNAUTHENTICATED" in out.stderr


def test_produce_on_a_allows_exactly_that(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    a, b = topics
    alice = users["alice"]  # may produce on a
    before_a, before_b = stored(secured, a), stored(secured, b)
    assert until_passes("alice's produce to a", lambda: run(secured, alice, produce(a, 3))) == 3
    assert stored(secured, a) == before_a + 3
    with pytest.raises(PermissionDeniedError) as refused:
        run(secured, alice, consume(a))
    assert "alice lacks" in refused.value.message and f"consume on topic {a}" in refused.value.message
    with pytest.raises(PermissionDeniedError) as refused:
        run(secured, alice, produce(b, 1))
    assert f"topic {b}" in refused.value.message
    assert stored(secured, b) == before_b
    # an unknown topic is refused the same way: the refusal does not say whether it exists
    with pytest.raises(PermissionDeniedError) as refused:
        run(secured, alice, produce("no-such-topic", 1))
    assert "no-such-topic" in refused.value.message
    # nor may alice manage users or read the metadata store
    with pytest.raises(PermissionDeniedError, match="admin on the cluster"):
        run(secured, alice, lambda client: client.controller.list_users())
    with pytest.raises(PermissionDeniedError):
        run(secured, alice, lambda client: client.controller.meta_list(""))


def test_grant_then_revoke_takes_effect(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    a, _ = topics
    bob = users["bob"]  # without any grant
    with pytest.raises(PermissionDeniedError):
        run(secured, bob, consume(a))
    grant(secured, "bob", "topic", "auth-*", "consume")
    assert until_passes("bob's read after the grant", lambda: run(secured, bob, consume(a))) == stored(
        secured, a
    )
    grant(secured, "bob", "topic", "auth-*", "consume", revoke=True)
    until_raises("bob's read after the revoke", lambda: run(secured, bob, consume(a)), PermissionDeniedError)


def test_a_group_consumer_needs_consume_on_its_group_too(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    a, _ = topics
    erin = users["erin"]  # may consume a
    run(secured, admin(secured), produce(a, 3))  # something to read, whichever tests ran before
    want = stored(secured, a)
    assert want >= 3

    async def consume_group(client: AsyncClient) -> int:
        consumer = client.consumer("erin-g", a, auto_commit=False)
        got: list[Any] = []
        try:
            deadline = time.monotonic() + 10
            while len(got) < want and time.monotonic() < deadline:
                got += await consumer.poll(100, timeout=1.0)
            await consumer.commit()
        finally:
            await consumer.close()
        return len(got)

    refusal("erin's group read", lambda: run(secured, erin, consume_group), "on group erin-g")
    grant(secured, "erin", "group", "erin-*", "consume")
    assert until_passes("erin's group read", lambda: run(secured, erin, consume_group)) == want

    async def committed(client: AsyncClient) -> list[dict[str, Any]]:
        return await client.admin().group_lag("erin-g", a)

    lag = run(secured, admin(secured), committed)
    assert sum(int(q["lag"]) for q in lag) == 0, lag  # erin's commit went through


def test_group_commits_in_one_frame_are_checked_per_group_and_a_refused_one_fails_alone(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    """Three members of one client commit at once: the COMMITS frame carrying them is refused for
    the group gina may not consume, and split until only that member gets the refusal."""
    a, _ = topics
    gina = users["gina"]  # may consume a and the groups gina-*

    async def commit_three(client: AsyncClient) -> tuple[list[Any], int]:
        master = (await client.route(a)).broker_sets[0].master_address
        await client.commits.commit(master, [("gina-first", a, 0, 0)])  # until gina is known there
        groups = ["gina-a", "other-g", "gina-b"]
        answers = await asyncio.gather(
            *(client.commits.commit(master, [(g, a, 0, 0)]) for g in groups), return_exceptions=True
        )
        return answers, client.commits.frames

    answers, frames = until_passes("gina's commits", lambda: run(secured, gina, commit_three))
    assert answers[0] is None and answers[2] is None, answers
    assert isinstance(answers[1], PermissionDeniedError) and "group other-g" in answers[1].message
    assert frames == 6  # the first; the three (refused); gina-a; the other two (refused); each alone

    async def committed(client: AsyncClient) -> dict[str, list[int | None]]:
        groups = ("gina-a", "gina-b", "other-g")
        return {g: [q["committed"] for q in await client.admin().group_lag(g, a)] for g in groups}

    assert run(secured, admin(secured), committed) == {"gina-a": [0], "gina-b": [0], "other-g": [None]}


def test_cli_manages_users_and_grants(secured: LocalCluster) -> None:
    made = cli(secured, "user", "create", "carol")
    assert (
        set(made) == {"name", "access_key", "secret_key", "rocketmq_secret_key"} and made["name"] == "carol"
    )
    assert made["rocketmq_secret_key"] == access.signing_key(made["secret_key"], made["access_key"])
    assert made["secret_key"] not in made["rocketmq_secret_key"]
    listed = cli(secured, "user", "list")
    users = {u["name"]: u["access_key"] for u in listed}
    assert users["carol"] == made["access_key"] and "admin" in users
    assert all("secret" not in json.dumps(u) for u in listed)
    # users are not in the metadata store: not even the admin reads them through Meta*
    entries = run(secured, admin(secured), lambda client: client.controller.meta_list(""))
    assert not any(made["access_key"].encode() in e.value or made["access_key"] in e.key for e in entries)
    cli(secured, "acl", "grant", "carol", "group", "g-*", "consume")
    assert {"user": "carol", "kind": "group", "resource": "g-*", "permission": "consume"} in cli(
        secured, "acl", "list", "--user", "carol"
    )
    cli(secured, "acl", "revoke", "carol", "group", "g-*", "consume")
    assert cli(secured, "acl", "list", "--user", "carol") == []
    cli(secured, "user", "delete", "carol")
    assert "carol" not in {u["name"] for u in cli(secured, "user", "list")}
    with pytest.raises(UnauthenticatedError):  # a deleted user's credentials no longer sign
        run(secured, made, lambda client: client.controller.describe_broker_sets())


def test_the_data_port_refuses_an_unsigned_or_unpermitted_connection(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    a, _ = topics
    dave = users["dave"]  # may consume another topic only
    creds = Credentials(dave["access_key"], dave["secret_key"])
    tls = client_tls(secured.state())

    async def data_address(client: AsyncClient) -> str:
        route = await client.route(a)
        reply = await client.call_broker(route.broker_sets[0].master_address, "Status", bpb.StatusRequest())
        return str(reply.data_address)

    address = run(secured, admin(secured), data_address)
    pull = [df.pull_request(df.PullCall(a, 0, 0, 10, 0, 0))]

    async def attempt(auth: Callable[[], tuple[tuple[str, str], ...]] | None) -> bytes:
        conn = DataConnection(address, tls, auth)
        try:
            return await conn.call(df.OP_PULL, pull, 5.0)
        finally:
            await conn.close()

    with pytest.raises(UnauthenticatedError):
        asyncio.run(attempt(None))  # no AUTH frame first
    wrong = Credentials(dave["access_key"], "guess")
    with pytest.raises(UnauthenticatedError):
        asyncio.run(attempt(lambda: Signer(wrong).extra(df.AUTH_METHOD, None)))
    # signed, but dave may not read this topic (the broker learns dave on its next heartbeat)
    signed = Signer(creds)

    def dave_pulls() -> bytes:
        return asyncio.run(attempt(lambda: signed.extra(df.AUTH_METHOD, None)))

    refusal("dave's pull", dave_pulls, f"dave lacks consume on topic {a}")
    grant(secured, "dave", "topic", a, "consume")
    body = until_passes("dave's pull after the grant", dave_pulls)
    assert df.parse_pulled(body).count == min(10, stored(secured, a))


def test_the_rocketmq_endpoint_takes_the_users_and_their_grants(
    secured: LocalCluster, topics: tuple[str, str], users: dict[str, dict[str, str]]
) -> None:
    a, b = topics
    frank = users["frank"]  # may produce on a
    key = Credentials(frank["access_key"], frank["secret_key"]).signing_key  # what a RocketMQ client is given

    async def endpoint(client: AsyncClient) -> str:
        route = await client.route(a)
        reply = await client.call_broker(route.broker_sets[0].master_address, "Status", bpb.StatusRequest())
        return str(reply.rocketmq_address)

    address = run(secured, admin(secured), endpoint)
    tls = client_tls(secured.state())
    assert tls is not None

    async def call(method: str, request: Any, signed: bool = True) -> str:
        async with tlsconfig.aio_channel(address, tls) as channel:
            stub = rmq_grpc.MessagingServiceStub(channel)
            metadata = access.headers(frank["access_key"], key, time.time()) if signed else ()
            reply = await getattr(stub, method)(request, metadata=metadata, timeout=10)
        return str(rmq_d.Code.Name(reply.status.code))

    def route(topic: str, signed: bool = True) -> str:
        request = rmq.QueryRouteRequest(topic=rmq_d.Resource(name=topic))
        return asyncio.run(call("QueryRoute", request, signed))

    def until_known() -> str:  # the broker learns frank, then his grant, on its next heartbeats
        deadline = time.monotonic() + 15
        while (code := route(a)) in ("UNAUTHORIZED", "FORBIDDEN") and time.monotonic() < deadline:
            time.sleep(0.3)
        return code

    assert route(a, signed=False) == "UNAUTHORIZED"
    assert until_known() == "OK"
    assert route(b) == "FORBIDDEN"
    before = stored(secured, b)
    send = rmq.SendMessageRequest(messages=[rmq_d.Message(topic=rmq_d.Resource(name=b), body=b"no")])
    assert asyncio.run(call("SendMessage", send)) == "FORBIDDEN"
    assert stored(secured, b) == before
    # a permitted send goes through the endpoint's own client, which signs as the cluster
    before = stored(secured, a)
    normal = rmq_d.SystemProperties(message_type=rmq_d.NORMAL, message_id="auth-1")
    message = rmq_d.Message(topic=rmq_d.Resource(name=a), body=b"yes", system_properties=normal)
    send = rmq.SendMessageRequest(messages=[message])
    assert asyncio.run(call("SendMessage", send)) == "OK"
    assert stored(secured, a) == before + 1


def test_ledger_permissions(secured: LocalCluster, users: dict[str, dict[str, str]]) -> None:
    writer, reader, fencer, nobody = (users[n] for n in ("lwriter", "lreader", "lfencer", "lnobody"))
    creator = users["lcreator"]  # may create a ledger, not write to it

    async def create_and_write(client: AsyncClient) -> int:
        w = await AsyncLedgers(client).create_ledger(2, 2, 1, PASSWORD)
        for i in range(3):
            await w.add_entry(b"entry-%d" % i)
        return w.ledger_id

    with pytest.raises(PermissionDeniedError, match="create on ledger"):
        run(secured, nobody, create_and_write)
    with pytest.raises(PermissionDeniedError, match="create on ledger"):
        run(secured, reader, create_and_write)
    ledger_id = until_passes("the writer's ledger", lambda: run(secured, writer, create_and_write))
    refusal("an add without write", lambda: run(secured, creator, create_and_write), "write on ledger")

    async def read(client: AsyncClient) -> list[bytes]:
        h = await AsyncLedgers(client).open_ledger(ledger_id, PASSWORD, recovery=False)
        return (
            [e.data for e in await h.read_entries(0, h.last_add_confirmed)]
            if h.last_add_confirmed >= 0
            else []
        )

    async def recover(client: AsyncClient) -> LedgerState:
        h = await AsyncLedgers(client).open_ledger(ledger_id, PASSWORD, recovery=True)
        return h.metadata.state

    async def state(client: AsyncClient) -> LedgerState:
        return (await AsyncLedgers(client).get_metadata(ledger_id)).state

    with pytest.raises(PermissionDeniedError, match="read on ledger"):
        run(secured, nobody, read)
    entries = until_passes("the reader's read", lambda: run(secured, reader, read))
    assert entries == [b"entry-%d" % i for i in range(len(entries))] and len(entries) >= 2
    with pytest.raises(PermissionDeniedError, match="fence"):
        run(secured, reader, recover)  # reading is not fencing
    assert run(secured, admin(secured), state) is LedgerState.OPEN  # the refused recovery changed nothing
    assert until_passes("the fencer's recovery", lambda: run(secured, fencer, recover)) is LedgerState.CLOSED


def test_an_operator_holding_the_cluster_secret_is_the_cluster(secured: LocalCluster) -> None:
    # no user credentials: the secret in controller.yaml of the data dir signs the user calls
    env = {k: v for k, v in admin_env(secured).items() if "KEY" not in k}
    out = tide("user", "list", "--data-dir", str(secured.data_dir), "--json", env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "admin" in {u["name"] for u in json.loads(out.stdout)}
