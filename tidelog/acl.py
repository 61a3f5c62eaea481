"""Permissions: which user may call which method on which resource (pure, no I/O).

Owns the rules of authorization, apart from how a caller is identified (tidelog/access.py) and
where the table of users and grants lives (the controller's replicated state):

- Resources are of four kinds, each with its permissions (`PERMISSIONS`): a topic (produce,
  consume), a consumer group (consume: read and commit its offsets and membership keys; admin:
  delete its offsets), a ledger (create, write, read, fence, delete; named by its decimal id) and
  the cluster (admin: topics, users, grants, elections, decommissioning, status).
- A grant gives one user one permission on the resources of one kind a pattern names: the exact
  name, `*` for all, or a prefix ending in `*` (`orders-*`). Cluster admin implies every
  permission on every resource: it is the administrator's role.
- `METHODS` maps every method of every client-facing gRPC service to the checks a call needs,
  pulled out of its request (`checks`); a method missing from the table is refused, so deny is
  the default. `authorize` runs them; a refusal names the permission that is missing and the
  resource the caller asked for, never whether that resource exists.
- `SUPERUSER` is the identity of a call signed with the cluster secret (a cluster member or an
  operator holding the secret): it may do everything, as it could already join the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLUSTER",
    "GROUP",
    "LEDGER",
    "METHODS",
    "PERMISSIONS",
    "SUPERUSER",
    "TOPIC",
    "AclState",
    "Check",
    "Grant",
    "User",
    "authorize",
    "checks",
    "decide",
    "grant_problem",
    "matches",
    "satisfied",
]

TOPIC, GROUP, LEDGER, CLUSTER = "topic", "group", "ledger", "cluster"
PERMISSIONS: dict[str, frozenset[str]] = {
    TOPIC: frozenset({"produce", "consume"}),
    GROUP: frozenset({"consume", "admin"}),
    LEDGER: frozenset({"create", "write", "read", "fence", "delete"}),
    CLUSTER: frozenset({"admin"}),
}
SUPERUSER = "(cluster secret)"
MAX_PATTERN = 255


@dataclass(frozen=True)
class User:
    """A user: its name, its access key and the signing key derived from its secret (hex)."""

    name: str
    access_key: str
    signing_key: str


@dataclass(frozen=True, order=True)
class Grant:
    """`user` may `permission` on the resources of `kind` that `pattern` matches."""

    user: str
    kind: str
    pattern: str
    permission: str


@dataclass(frozen=True)
class AclState:
    """The users and grants a server decides with; `version` grows with every change."""

    version: int = 0
    users: Mapping[str, User] = field(default_factory=dict)
    grants: frozenset[Grant] = frozenset()
    # access key -> user, built once: every call looks its signer up here
    by_key: Mapping[str, User] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_key", {u.access_key: u for u in self.users.values()})

    def user_by_key(self, access_key: str) -> User | None:
        return self.by_key.get(access_key)


def grant_problem(kind: str, pattern: str, permission: str) -> str | None:
    """Why (kind, pattern, permission) cannot be a grant, or None if it can."""
    if kind not in PERMISSIONS:
        return f"no resource kind {kind!r} (one of {', '.join(sorted(PERMISSIONS))})"
    if permission not in PERMISSIONS[kind]:
        return f"a {kind} has no permission {permission!r} (one of {', '.join(sorted(PERMISSIONS[kind]))})"
    if kind == CLUSTER and pattern != "*":
        return "the cluster is one resource: grant cluster admin on '*'"
    if not pattern or len(pattern) > MAX_PATTERN or "*" in pattern[:-1]:
        return f"pattern {pattern[:80]!r}: a name, '*', or a prefix ending in '*' (at most {MAX_PATTERN})"
    return None


def matches(pattern: str, name: str) -> bool:
    """Whether a grant's pattern names resource `name`: equal, `*`, or a prefix ending in `*`."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return pattern == name


def _allowed(grants: Iterable[Grant], user: str, permission: str, kind: str, name: str) -> bool:
    for g in grants:
        if g.user != user:
            continue
        if g.kind == CLUSTER and g.permission == "admin":
            return True
        if g.kind == kind and g.permission == permission and matches(g.pattern, name):
            return True
    return False


def _resource(kind: str, name: str) -> str:
    """A resource as a sentence names it: "topic orders", but "the cluster" (not "cluster cluster")."""
    return "the cluster" if kind == CLUSTER else f"{kind} {name}"


def decide(identity: str, state: AclState, permission: str, resource: tuple[str, str]) -> str | None:
    """None if `identity` (a user name, or SUPERUSER) may `permission` on `resource` (kind, name);
    otherwise the reason, naming the permission it lacks."""
    if identity == SUPERUSER:
        return None
    kind, name = resource
    if _allowed(state.grants, identity, permission, kind, name):
        return None
    return f"user {identity} lacks {permission} on {_resource(kind, name)}"


# --- the method table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A call needs one of `permissions` on resource `name` of `kind`."""

    permissions: tuple[str, ...]
    kind: str
    name: str


def _field(kind: str, attr: str, *permissions: str) -> Callable[[Any], list[Check]]:
    return lambda r: [Check(permissions, kind, str(getattr(r, attr)))]


def _both(*rules: Callable[[Any], list[Check]]) -> Callable[[Any], list[Check]]:
    return lambda r: [c for rule in rules for c in rule(r)]


def _fixed(kind: str, name: str, *permissions: str) -> Callable[[Any], list[Check]]:
    return lambda r: [Check(permissions, kind, name)]


def _nothing(request: Any) -> list[Check]:
    """Any authenticated user: the broker sets' addresses, which every client needs to connect."""
    return []


_ADMIN = _fixed(CLUSTER, CLUSTER, "admin")
_LEDGER_PREFIX = "ledger/"
_GROUP_PREFIX = "group/"
# where ledger ids come from (ledger/params.py): a creator takes the next id from this shared
# counter, so creating ledgers needs create on every ledger ('*'), not on a chosen id
_LEDGER_COUNTER = "ledger-id-counter"


def _meta(key: str, ledger_permissions: tuple[str, ...]) -> Check:
    """What a metadata key is part of: a group's keys need its consume (or admin), a ledger's the given
    permission, the ledger id counter create on all ledgers, every other key cluster admin."""
    if key == _LEDGER_COUNTER:
        return Check(("create",), LEDGER, "*")
    if key.startswith(_GROUP_PREFIX):
        group = key[len(_GROUP_PREFIX) :].split("/", 1)[0]
        if group:  # a group's admin resets and deletes what its members write here
            return Check(("consume", "admin"), GROUP, group)
    if key.startswith(_LEDGER_PREFIX):
        rest = key[len(_LEDGER_PREFIX) :]
        if rest.isdigit() and rest.isascii():
            return Check(ledger_permissions, LEDGER, str(int(rest)))
    return Check(("admin",), CLUSTER, CLUSTER)


def _meta_list(request: Any) -> list[Check]:
    prefix = str(request.prefix)
    if prefix.startswith(_GROUP_PREFIX) and "/" in prefix[len(_GROUP_PREFIX) :]:
        return [_meta(prefix, ())]
    if prefix == _LEDGER_PREFIX:
        return [Check(("read",), LEDGER, "*")]
    return [Check(("admin",), CLUSTER, CLUSTER)]


def _ledger_add(request: Any) -> list[Check]:
    # a recovery add rewrites an entry the recovering reader found: part of fencing the ledger
    permissions = ("write", "fence") if request.recovery else ("write",)
    return [Check(permissions, LEDGER, str(request.ledger_id))]


def _ledger_read(request: Any) -> list[Check]:
    name = str(request.ledger_id)
    out = [Check(("read",), LEDGER, name)]
    if request.fence:  # a recovery read fences the ledger on the replica
        out.append(Check(("fence",), LEDGER, name))
    return out


def _commits(request: Any) -> list[Check]:
    """A batch of group commits: consume on each group and on each topic it names, once each."""
    groups = sorted({str(c.group) for c in request.commits})
    topics = sorted({str(c.topic) for c in request.commits})
    return [Check(("consume",), GROUP, g) for g in groups] + [Check(("consume",), TOPIC, t) for t in topics]


_B = "/tidelog.broker.v1.Broker/"
_L = "/tidelog.ledger.Ledger/"
_R = "/tidelog.controller.v1.ControllerRoute/"
_A = "/tidelog.controller.v1.ControllerAdmin/"
_TOPIC_CONSUME = _field(TOPIC, "topic", "consume")
_GROUP_CONSUME = _field(GROUP, "group", "consume")

#: full gRPC method name -> the checks a call of it needs, from its request.
METHODS: dict[str, Callable[[Any], list[Check]]] = {
    _B + "Produce": _field(TOPIC, "topic", "produce"),
    _B + "ProduceBatch": _field(TOPIC, "topic", "produce"),
    _B + "Pull": _TOPIC_CONSUME,
    _B + "GetMessage": _TOPIC_CONSUME,
    # a message id names no topic: reading any message by id needs consume on every topic
    _B + "GetMessageById": _fixed(TOPIC, "*", "consume"),
    _B + "FindMessages": _TOPIC_CONSUME,
    _B + "GetOffsets": _TOPIC_CONSUME,
    _B + "CommitOffset": _both(_GROUP_CONSUME, _TOPIC_CONSUME),
    _B + "CommitOffsets": _commits,
    _B + "FetchOffset": _GROUP_CONSUME,
    _B + "SearchOffset": _TOPIC_CONSUME,
    _B + "ListGroupOffsets": _GROUP_CONSUME,
    _B + "DeleteGroupOffsets": _field(GROUP, "group", "admin"),
    # the broker's status carries its data port's address, which a client needs to connect
    _B + "Status": _nothing,
    _B + "SharedReceive": _both(_GROUP_CONSUME, _TOPIC_CONSUME),
    _B + "SharedAck": _both(_GROUP_CONSUME, _TOPIC_CONSUME),
    _B + "SharedChangeInvisible": _both(_GROUP_CONSUME, _TOPIC_CONSUME),
    _B + "SharedDeadLetter": _both(_GROUP_CONSUME, _TOPIC_CONSUME),
    _L + "Create": _field(LEDGER, "ledger_id", "create"),
    _L + "Add": _ledger_add,
    _L + "AddBatch": _field(LEDGER, "ledger_id", "write"),
    _L + "Close": _field(LEDGER, "ledger_id", "write"),
    _L + "Fence": _field(LEDGER, "ledger_id", "fence"),
    _L + "Read": _ledger_read,
    _L + "Lac": _field(LEDGER, "ledger_id", "read"),
    _R + "GetRoute": _field(TOPIC, "topic", "produce", "consume"),
    _R + "DescribeBrokerSets": _nothing,
    _A + "CreateTopic": _ADMIN,
    _A + "CreateTopics": _ADMIN,
    _A + "DeleteTopic": _ADMIN,
    _A + "AlterTopicQueues": _ADMIN,
    _A + "AlterTopicRetention": _ADMIN,
    _A + "ListTopics": _ADMIN,
    _A + "ElectMaster": _ADMIN,
    _A + "CleanBrokerData": _ADMIN,
    _A + "MetaCreate": lambda r: [_meta(r.key, ("create",))],
    _A + "MetaGet": lambda r: [_meta(r.key, ("read",))],
    # a ledger's metadata changes when its writer closes it and when a reader recovers it
    _A + "MetaCompareAndSet": lambda r: [_meta(r.key, ("write", "fence"))],
    _A + "MetaDelete": lambda r: [_meta(r.key, ("delete",))],
    _A + "MetaList": _meta_list,
    _A + "ClusterStatus": _ADMIN,
    _A + "PlacementAudit": _ADMIN,
    _A + "DecommissionBroker": _ADMIN,
    _A + "RepairPlacement": _ADMIN,
    _A + "CreateUser": _ADMIN,
    _A + "DeleteUser": _ADMIN,
    _A + "ListUsers": _ADMIN,
    _A + "GrantAcl": _ADMIN,
    _A + "RevokeAcl": _ADMIN,
    _A + "ListAcls": _ADMIN,
}


def checks(method: str, request: Any) -> list[Check] | None:
    """The checks a call of `method` (full name) needs; None for a method the table lacks."""
    rule = METHODS.get(method)
    return None if rule is None else rule(request)


def authorize(identity: str, state: AclState, method: str, request: Any) -> str | None:
    """None if `identity` may make this call; otherwise why not (the first missing permission)."""
    if identity == SUPERUSER:
        return None
    needed = checks(method, request) if request is not None else None
    if needed is None:
        return f"{method.rpartition('/')[2]} is not open to users"
    return satisfied(identity, state, needed)


def satisfied(identity: str, state: AclState, needed: Iterable[Check]) -> str | None:
    """None if `identity` holds one of the permissions of every check; otherwise the first it lacks
    (other tables than METHODS use it: the RocketMQ endpoint's, broker/rocketmqrules.py)."""
    for c in needed:
        reasons = [decide(identity, state, p, (c.kind, c.name)) for p in c.permissions]
        if all(r is not None for r in reasons):
            return f"user {identity} lacks {' or '.join(c.permissions)} on {_resource(c.kind, c.name)}"
    return None
