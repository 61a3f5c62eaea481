"""Users and grants in the controller state (controller/users.py): validated, versioned, a
deleted user's grants go with it, refusals change nothing, and all of it survives a snapshot
(and older snapshots read with none)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog import acl
from tidelog.acl import Grant, User
from tidelog.controller.state import ControllerState, CreateUser, DeleteUser, GrantAcl, RevokeAcl

KEY = "ab" * 32


def with_alice() -> ControllerState:
    s = ControllerState()
    assert s.apply(CreateUser("alice", "AKalice1", KEY)).ok
    return s


def test_users_and_grants_survive_a_snapshot() -> None:
    s = with_alice()
    assert s.apply(GrantAcl("alice", "topic", "orders-*", "produce")).ok
    restored = ControllerState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert restored == s
    table = restored.acl_table()
    assert table.users == {"alice": User("alice", "AKalice1", KEY)}
    assert table.grants == {Grant("alice", "topic", "orders-*", "produce")}
    assert table.version == 2


def test_a_format_2_snapshot_reads_with_no_users() -> None:
    d = ControllerState().to_dict()
    for k in ("users", "grants", "acl_version"):
        del d[k]
    d["format"] = 2
    assert ControllerState.from_dict(d).acl_table().users == {}


def test_every_change_moves_the_version_and_a_repeat_does_not() -> None:
    s = with_alice()
    assert s.acl_version == 1
    assert s.apply(GrantAcl("alice", "group", "g", "consume")).changed
    assert not s.apply(GrantAcl("alice", "group", "g", "consume")).changed
    assert s.acl_version == 2
    assert s.apply(RevokeAcl("alice", "group", "g", "consume")).changed
    assert s.acl_version == 3 and not s.grants


def test_deleting_a_user_deletes_its_grants() -> None:
    s = with_alice()
    assert s.apply(GrantAcl("alice", "topic", "*", "consume")).ok
    assert s.apply(DeleteUser("alice")).ok
    assert s.users == {} and s.grants == set()
    assert s.apply(CreateUser("alice", "AKalice1", KEY)).ok
    assert s.grants == set()


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (CreateUser("alice", "AKother1", KEY), "USER_EXISTS"),
        (CreateUser("bob", "AKalice1", KEY), "USER_EXISTS"),  # the access key is taken
        (CreateUser("bob", "AK", KEY), "INVALID_ARGUMENT"),
        (CreateUser("bob", "AKbob0001", "secret-in-clear"), "INVALID_ARGUMENT"),
        (CreateUser("b o b", "AKbob0001", KEY), "INVALID_ARGUMENT"),
        (DeleteUser("bob"), "USER_NOT_FOUND"),
        (GrantAcl("bob", "topic", "t", "produce"), "USER_NOT_FOUND"),
        (GrantAcl("alice", "topic", "t", "fence"), "INVALID_ARGUMENT"),
        (GrantAcl("alice", "topic", "t*x", "produce"), "INVALID_ARGUMENT"),
        (RevokeAcl("alice", "nope", "t", "produce"), "INVALID_ARGUMENT"),
    ],
)
def test_refusals_change_nothing(cmd: object, code: str) -> None:
    s = with_alice()
    before = s.to_dict()
    r = s.apply(cmd)
    assert r.code == code and not r.changed
    assert s.to_dict() == before


GRANTS = st.builds(
    Grant,
    st.just("alice"),
    st.just("topic"),
    st.sampled_from(["orders", "orders-*", "*", "pay"]),
    st.sampled_from(["produce", "consume"]),
)


@given(
    st.lists(st.tuples(st.booleans(), GRANTS), max_size=30), st.sampled_from(["orders", "orders-eu", "pay"])
)
def test_after_any_grants_and_revokes_only_what_is_still_granted_is_allowed(
    steps: list[tuple[bool, Grant]], topic: str
) -> None:
    s = with_alice()
    model: set[Grant] = set()
    for grant, g in steps:
        cmd = GrantAcl if grant else RevokeAcl
        assert s.apply(cmd(g.user, g.kind, g.pattern, g.permission)).ok
        (model.add if grant else model.discard)(g)
    assert s.grants == model
    table = s.acl_table()
    for permission in ("produce", "consume"):
        allowed = acl.decide("alice", table, permission, ("topic", topic)) is None
        assert allowed == any(g.permission == permission and acl.matches(g.pattern, topic) for g in model)
    revoked = [g for grant, g in steps if not grant and g not in model]
    for g in revoked:  # a revoked grant gives nothing by itself any more
        others = [o for o in model if o.permission == g.permission and acl.matches(o.pattern, topic)]
        if not others:
            assert acl.decide("alice", table, g.permission, ("topic", topic)) is not None
