"""Users and grants in the controller state: CreateUser, DeleteUser, GrantAcl, RevokeAcl.

A user is a name, an access key and the signing key derived from its secret (tidelog/access.py):
the secret itself never reaches the controller, and the signing key is kept wrapped under the
cluster secret (the service wraps it before the command enters the Raft log). Grants follow tidelog/acl.py. Every change moves
``acl_version`` up by one, so a broker that holds the table of some version knows whether it has
the newest (the heartbeat reply carries the table when the versions differ). Deleting a user
deletes its grants too, so a user created again under that name starts with none.
"""

from __future__ import annotations

import re

from tidelog.access import is_stored_key
from tidelog.acl import Grant, User, grant_problem

from .commands import CreateUser, DeleteUser, GrantAcl, Result, RevokeAcl
from .model import NAME_PATTERN, StateData
from .validation import Outcome, Reject, bad, need_name

ACCESS_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{4,128}$")
MAX_USERS = 10_000
MAX_GRANTS = 100_000


def _need_user(s: StateData, name: str) -> None:
    if name not in s.users:
        raise Reject("USER_NOT_FOUND", f"no user named {name!r}")


def create_user(s: StateData, c: CreateUser) -> Outcome:
    need_name(c.name, "user name")
    if not isinstance(c.access_key, str) or not ACCESS_KEY_PATTERN.match(c.access_key):
        raise bad("an access key is 4..128 letters, digits, '_', '.' or '-'")
    # stored wrapped under the cluster secret (tidelog/access.py); in clear only in the journals
    # of older versions, still replayed as they are
    if not isinstance(c.signing_key, str) or not is_stored_key(c.signing_key):
        raise bad("a signing key is 64 lower-case hex digits (tidelog.access.signing_key), wrapped")
    if c.name in s.users:
        raise Reject("USER_EXISTS", f"user {c.name!r} already exists")
    if any(u.access_key == c.access_key for u in s.users.values()):
        raise Reject("USER_EXISTS", "another user has that access key")
    if len(s.users) >= MAX_USERS:
        raise bad(f"at most {MAX_USERS} users")
    user = User(c.name, c.access_key, c.signing_key)
    s.users[c.name] = user
    s.acl_version += 1
    return Result(value=user, changed=True), None


def delete_user(s: StateData, c: DeleteUser) -> Outcome:
    _need_user(s, c.name)
    del s.users[c.name]
    s.grants = {g for g in s.grants if g.user != c.name}
    s.acl_version += 1
    return Result(changed=True), None


def _grant_of(s: StateData, user: str, kind: str, pattern: str, permission: str) -> Grant:
    if not isinstance(user, str) or not NAME_PATTERN.match(user):
        raise bad(f"user name {str(user)[:80]!r} is not a valid name")
    problem = grant_problem(kind, pattern, permission)
    if problem is not None:
        raise bad(problem)
    _need_user(s, user)
    return Grant(user, kind, pattern, permission)


def grant_acl(s: StateData, c: GrantAcl) -> Outcome:
    g = _grant_of(s, c.user, c.kind, c.pattern, c.permission)
    if g in s.grants:
        return Result(value=g), None  # granted already: nothing changes, the version stays
    if len(s.grants) >= MAX_GRANTS:
        raise bad(f"at most {MAX_GRANTS} grants")
    s.grants.add(g)
    s.acl_version += 1
    return Result(value=g, changed=True), None


def revoke_acl(s: StateData, c: RevokeAcl) -> Outcome:
    g = _grant_of(s, c.user, c.kind, c.pattern, c.permission)
    if g not in s.grants:
        return Result(value=g), None
    s.grants.discard(g)
    s.acl_version += 1
    return Result(value=g, changed=True), None
