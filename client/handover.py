"""Queue ownership within a consumer group: sticky assignment and exact hand-over (pure; time passed in).

Each queue a group reads has at most one owner key in the controller's metadata store,
`group/<group>/owners/<topic>/<broker set>/<queue>`, whose value is the owning member's id. A
member pulls a queue only while it holds that key, so two members never read one queue at once:

- `sticky_assign` gives every live member its target share. It keeps each queue with its current
  owner while the shares stay within one queue of each other, so a join or a leave moves as few
  queues as possible. Every member computes it from the same inputs (live members, owner keys),
  so they agree once they have read the same store.
- `plan` compares the target with the owner keys and says what this member does now: release
  the queues it holds that the target gives elsewhere (the shell commits what `poll` returned for
  them first, then deletes the key at its version), create the key of a target queue nobody
  holds, replace (compare-and-set at its version) the key of one whose holder's session expired,
  and wait for any other. The next owner therefore starts from the committed offset written after
  the last delivery of the previous one: a clean hand-over delivers nothing twice. A member killed
  without closing re-delivers at most what it delivered after its last commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Queue = tuple[str, int]  # (broker set, queue)

OWNERS_PREFIX = "group/{group}/owners/{topic}/"


def owners_prefix(group: str, topic: str) -> str:
    return OWNERS_PREFIX.format(group=group, topic=topic)


def owner_key(group: str, topic: str, queue: Queue) -> str:
    return f"{owners_prefix(group, topic)}{queue[0]}/{queue[1]}"


@dataclass(frozen=True)
class Owner:
    """Who holds a queue's owner key, and the key's version (for compare-and-set and delete)."""

    member: str
    version: int


def parse_owners(entries: Iterable[tuple[str, bytes, int]], prefix: str) -> dict[Queue, Owner]:
    """Owner keys (key, value, version) under `prefix` by queue; malformed keys are skipped."""
    out: dict[Queue, Owner] = {}
    for key, value, version in entries:
        broker_set, sep, queue = key[len(prefix) :].rpartition("/")
        if not key.startswith(prefix) or not sep or not broker_set or not queue.isdigit() or not value:
            continue
        out[(broker_set, int(queue))] = Owner(value.decode(errors="replace"), version)
    return out


def _quotas(members: Sequence[str], queues: int, held: Mapping[str, int]) -> dict[str, int]:
    """How many queues each member gets: all get `queues // n`; the `queues % n` extra ones go to
    the members that hold most now (capped at the larger share, so that ties are broken by id
    rather than by how far over their share members are), then by id: nobody sheds needlessly."""
    base, extra = divmod(queues, len(members))
    ranked = sorted(members, key=lambda m: (-min(held.get(m, 0), base + 1), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}


def sticky_assign(
    members: Iterable[str], queues: Iterable[Queue], owners: Mapping[Queue, str]
) -> dict[Queue, str]:
    """The target owner of every queue: each live member keeps the queues it owns up to its
    quota, and the rest (unowned, owned by a member no longer live, or over quota) fill the
    members below their quota, lowest queue first, member by member in id order. Deterministic:
    the same inputs give the same answer whatever their order. Empty without members."""
    live = sorted(set(members))
    ordered = sorted(set(queues))
    if not live:
        return {}
    current: dict[str, list[Queue]] = {m: [] for m in live}
    for q in ordered:
        holder = owners.get(q)
        if holder in current:
            current[holder].append(q)
    quota = _quotas(live, len(ordered), {m: len(qs) for m, qs in current.items()})
    target: dict[Queue, str] = {}
    for m in live:
        for q in current[m][: quota[m]]:
            target[q] = m
    free = iter(q for q in ordered if q not in target)
    for m in live:
        for _ in range(quota[m] - len(current[m][: quota[m]])):
            target[next(free)] = m
    return target


@dataclass(frozen=True)
class Plan:
    """What one member does at a rebalance, each list sorted.

    release: keys it holds that the target gives to another member (or whose queue left the
        route): stop pulling, commit what was delivered, delete the key at its version.
    take: target queues without a key: create the key, then start at the committed offset.
    take_over: target queues whose holder's session expired: replace the key at that version.
    adopt: keys that already name this member but that it does not read (a restart under the same
        member id, or a create whose reply was lost): start at the committed offset.
    lost: queues it reads whose key names another member or is gone (its own session expired and
        another member took over): stop at once, without committing over the new owner.
    resume: queues it revoked but still holds (their commit was deferred) that the target gives
        back to it: read them again.
    """

    release: tuple[Queue, ...] = ()
    take: tuple[Queue, ...] = ()
    take_over: tuple[tuple[Queue, int], ...] = ()
    adopt: tuple[Queue, ...] = ()
    lost: tuple[Queue, ...] = ()
    resume: tuple[Queue, ...] = ()


def plan(
    me: str,
    live: Iterable[str],
    queues: Iterable[Queue],
    owners: Mapping[Queue, Owner],
    reading: Iterable[Queue],
    revoked: Iterable[Queue] = (),
) -> Plan:
    """This member's actions given the live members (sessions not expired, `me` among them when
    its own announcement is current), the route's queues, the owner keys, the queues it has
    started and, among them, those it revoked but has not released yet."""
    live_set = set(live)
    target = sticky_assign(live_set, queues, {q: o.member for q, o in owners.items()})
    reading_set = set(reading)
    mine = {q for q, o in owners.items() if o.member == me}
    take, take_over = [], []
    for q in sorted(q for q, m in target.items() if m == me and q not in mine):
        holder = owners.get(q)
        if holder is None:
            take.append(q)
        elif holder.member not in live_set:
            take_over.append((q, holder.version))
    return Plan(
        release=tuple(sorted(q for q in mine if target.get(q) != me)),
        take=tuple(take),
        take_over=tuple(take_over),
        adopt=tuple(sorted(q for q in mine if target.get(q) == me and q not in reading_set)),
        lost=tuple(sorted(reading_set - mine)),
        resume=tuple(sorted(q for q in set(revoked) & mine & reading_set if target.get(q) == me)),
    )


def moves(before: Mapping[Queue, str], after: Mapping[Queue, str]) -> int:
    """How many queues change owner between two assignments (a queue without owner counts)."""
    return sum(1 for q, m in after.items() if before.get(q) != m)
