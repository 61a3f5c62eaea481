"""Users and grants in the controller state (controller/users.py): validated, versioned, a
deleted user's grants go with it, refusals change nothing, and all of it survives a snapshot
(and older snapshots read with none)."""

from __future__ import annotations

import json

import pytest

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
