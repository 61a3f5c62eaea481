"""The permission rules (tidelog/acl.py): table tests, properties (deny by default, a revoked
permission is never allowed, wildcards), and the method table covering every client-facing
method of the protos."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog import acl
from tidelog.acl import AclState, Grant, User
from tidelog.proto import broker_pb2, controller_pb2, ledger_pb2
from tidelog.proto import controller_pb2 as cpb

ALICE = User("alice", "AKalice1", "0" * 64)


def state(*grants: Grant) -> AclState:
    return AclState(1, {"alice": ALICE}, frozenset(grants))


def g(kind: str, pattern: str, permission: str, user: str = "alice") -> Grant:
    return Grant(user, kind, pattern, permission)


@pytest.mark.parametrize(
    ("grants", "permission", "resource", "allowed"),
    [
        ((), "produce", ("topic", "orders"), False),
        ((g("topic", "orders", "produce"),), "produce", ("topic", "orders"), True),
        ((g("topic", "orders", "produce"),), "consume", ("topic", "orders"), False),
        ((g("topic", "orders", "produce"),), "produce", ("topic", "orders2"), False),
        ((g("topic", "orders-*", "produce"),), "produce", ("topic", "orders-eu"), True),
        ((g("topic", "orders-*", "produce"),), "produce", ("topic", "order"), False),
        ((g("topic", "*", "consume"),), "consume", ("topic", "anything"), True),
        ((g("group", "*", "consume"),), "consume", ("topic", "anything"), False),  # kinds differ
        ((g("topic", "orders", "produce", user="bob"),), "produce", ("topic", "orders"), False),
        ((g("cluster", "*", "admin"),), "delete", ("ledger", "42"), True),  # admin implies all
        ((g("ledger", "4*", "read"),), "read", ("ledger", "42"), True),
        ((g("ledger", "4*", "read"),), "fence", ("ledger", "42"), False),
    ],
)
def test_decide(grants: tuple[Grant, ...], permission: str, resource: tuple[str, str], allowed: bool) -> None:
    why = acl.decide("alice", state(*grants), permission, resource)
    assert (why is None) is allowed, why
    if not allowed:
        assert why == f"user alice lacks {permission} on {resource[0]} {resource[1]}"


def test_the_cluster_secret_may_do_everything() -> None:
    assert acl.decide(acl.SUPERUSER, AclState(), "admin", ("cluster", "cluster")) is None
    assert acl.authorize(acl.SUPERUSER, AclState(), "/x.Y/Unknown", None) is None


KINDS = st.sampled_from(sorted(acl.PERMISSIONS))
NAMES = st.text(alphabet="ab-*", min_size=1, max_size=6)


@st.composite
def grants(draw: st.DrawFn) -> Grant:
    kind = draw(st.sampled_from(["topic", "group", "ledger"]))  # cluster admin implies all: apart
    return Grant(
        draw(st.sampled_from(["alice", "bob"])),
        kind,
        draw(st.sampled_from(["*", "a", "ab", "a*", "b*", "ab-*"])),
        draw(st.sampled_from(sorted(acl.PERMISSIONS[kind]))),
    )


@given(st.frozensets(grants(), max_size=8), KINDS, st.text(alphabet="ab-", min_size=1, max_size=6))
def test_deny_by_default_and_only_a_matching_grant_allows(gs: frozenset[Grant], kind: str, name: str) -> None:
    for permission in acl.PERMISSIONS[kind]:
        allowed = acl.decide("alice", AclState(1, {}, gs), permission, (kind, name)) is None
        expected = any(
            x.user == "alice"
            and x.kind == kind
            and x.permission == permission
            and acl.matches(x.pattern, name)
            for x in gs
        )
        assert allowed == expected


@given(st.frozensets(grants(), max_size=8), st.data())
def test_a_revoked_permission_is_never_allowed(gs: frozenset[Grant], data: st.DataObject) -> None:
    revoked = data.draw(grants())
    # every grant of alice that would give this permission on this resource is revoked
    name = data.draw(st.text(alphabet="ab-", min_size=1, max_size=6))
    left = frozenset(
        x
        for x in gs | {revoked}
        if not (
            x.user == revoked.user
            and x.kind == revoked.kind
            and x.permission == revoked.permission
            and acl.matches(x.pattern, name)
        )
    )
    why = acl.decide(revoked.user, AclState(2, {}, left), revoked.permission, (revoked.kind, name))
    assert why is not None


@given(st.text(alphabet="abc-", max_size=8), st.text(alphabet="abc-", max_size=8))
def test_wildcards(prefix: str, rest: str) -> None:
    assert acl.matches("*", prefix + rest)
    assert acl.matches(prefix + "*", prefix + rest)
    assert acl.matches(prefix + rest, prefix + rest) if prefix + rest else True
    if rest:
        assert not acl.matches(prefix + rest + "x", prefix + rest)


@pytest.mark.parametrize(
    ("kind", "pattern", "permission", "ok"),
    [
        ("topic", "orders", "produce", True),
        ("topic", "orders-*", "consume", True),
        ("topic", "*", "consume", True),
        ("topic", "or*ders", "consume", False),  # a star only at the end
        ("topic", "", "consume", False),
        ("topic", "orders", "fence", False),
        ("queue", "orders", "produce", False),
        ("cluster", "*", "admin", True),
        ("cluster", "prod", "admin", False),  # the cluster is one resource
        ("ledger", "*", "fence", True),
    ],
)
def test_grant_problem(kind: str, pattern: str, permission: str, ok: bool) -> None:
    assert (acl.grant_problem(kind, pattern, permission) is None) is ok


CLIENT_FACING = [
    broker_pb2.DESCRIPTOR.services_by_name["Broker"],
    ledger_pb2.DESCRIPTOR.services_by_name["Ledger"],
    controller_pb2.DESCRIPTOR.services_by_name["ControllerRoute"],
    controller_pb2.DESCRIPTOR.services_by_name["ControllerAdmin"],
]


def test_every_client_facing_method_has_a_rule_and_the_table_names_no_other() -> None:
    methods = {f"/{s.full_name}/{m.name}" for s in CLIENT_FACING for m in s.methods}
    assert methods - acl.METHODS.keys() == set(), "methods without a permission rule"
    assert acl.METHODS.keys() - methods == set(), "rules for methods no service has"
    for s in CLIENT_FACING:
        for m in s.methods:
            from google.protobuf import message_factory

            request = message_factory.GetMessageClass(m.input_type)()
            found = acl.checks(f"/{s.full_name}/{m.name}", request)
            assert found is not None


def test_a_method_missing_from_the_table_is_refused() -> None:
    assert acl.authorize("alice", state(g("cluster", "*", "admin")), "/a.B/New", None) is not None


@pytest.mark.parametrize(
    ("method", "request_", "granted", "allowed"),
    [
        (
            "/tidelog.broker.v1.Broker/Produce",
            broker_pb2.ProduceRequest(topic="a"),
            g("topic", "a", "produce"),
            True,
        ),
        (
            "/tidelog.broker.v1.Broker/Pull",
            broker_pb2.PullRequest(topic="a"),
            g("topic", "a", "produce"),
            False,
        ),
        (
            "/tidelog.broker.v1.Broker/SharedReceive",
            broker_pb2.SharedReceiveRequest(topic="a", group="g"),
            g("topic", "a", "consume"),
            False,  # the group's consume too
        ),
        ("/tidelog.ledger.Ledger/Read", ledger_pb2.ReadRequest(ledger_id=7), g("ledger", "7", "read"), True),
        (
            "/tidelog.ledger.Ledger/Read",
            ledger_pb2.ReadRequest(ledger_id=7, fence=True),
            g("ledger", "7", "read"),
            False,  # a fencing read needs fence
        ),
        (
            "/tidelog.controller.v1.ControllerRoute/GetRoute",
            cpb.GetRouteRequest(topic="a"),
            g("topic", "a", "consume"),
            True,
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaGet",
            cpb.MetaGetRequest(key="group/g/members/m1"),
            g("group", "g", "consume"),
            True,
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaDelete",
            cpb.MetaDeleteRequest(key="group/g/members/m1"),
            g("group", "g", "admin"),
            True,  # the group's admin deletes what its members wrote
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaDelete",
            cpb.MetaDeleteRequest(key="group/g/members/m1"),
            g("group", "h", "admin"),
            False,
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaCreate",
            cpb.MetaCreateRequest(key="ledger/0000000000000000042"),
            g("ledger", "42", "create"),
            True,
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaCompareAndSet",
            cpb.MetaCompareAndSetRequest(key="ledger-id-counter"),
            g("ledger", "*", "create"),
            True,  # the id counter every creator takes the next id from
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaCompareAndSet",
            cpb.MetaCompareAndSetRequest(key="ledger-id-counter"),
            g("ledger", "4*", "create"),
            False,
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaGet",
            cpb.MetaGetRequest(key="other/key"),
            g("group", "*", "consume"),
            False,  # any other key: cluster admin
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/MetaList",
            cpb.MetaListRequest(prefix="group/"),
            g("group", "*", "consume"),
            False,  # every group's keys: cluster admin
        ),
        (
            "/tidelog.controller.v1.ControllerAdmin/CreateUser",
            cpb.CreateUserRequest(),
            g("topic", "*", "produce"),
            False,
        ),
    ],
)
def test_methods_need_their_permissions(method: str, request_: object, granted: Grant, allowed: bool) -> None:
    why = acl.authorize("alice", state(granted), method, request_)
    assert (why is None) is allowed, why


def test_a_batch_of_group_commits_needs_consume_on_every_group_and_topic_it_names() -> None:
    method = "/tidelog.broker.v1.Broker/CommitOffsets"
    granted = state(g("group", "a", "consume"), g("topic", "t", "consume"))

    def batch(*pairs: tuple[str, str]) -> broker_pb2.CommitOffsetsRequest:
        return broker_pb2.CommitOffsetsRequest(
            commits=[broker_pb2.CommitOffsetRequest(group=grp, topic=top) for grp, top in pairs]
        )

    assert acl.authorize("alice", granted, method, batch(("a", "t"), ("a", "t"))) is None
    assert acl.authorize("alice", granted, method, batch(("a", "t"), ("b", "t"))) is not None  # group b
    assert acl.authorize("alice", granted, method, batch(("a", "t"), ("a", "u"))) is not None  # topic u
