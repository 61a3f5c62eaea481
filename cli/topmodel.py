"""What `tide top` shows, as pure functions: cluster answers → a snapshot; two snapshots → rates.

No I/O and no clock here: `cli/top.py` asks the controllers and brokers, stamps each
snapshot with the time it was taken, and renders what `view` returns. `view` is also the JSON
document of `tide top --json` — a stable shape, `SCHEMA_VERSION` 1:

    {"version": 1, "time": "<ISO 8601 UTC>", "rate_window_s": 1.0 | null,
     "liveness_known": true,
     "broker_sets": [{"name", "master", "epoch", "sync_state_set", "sync_state_set_epoch",
                      "max_offset", "produce_bytes_per_s",
                      "members": [{"broker_id", "address", "datacenter", "alive", "in_sync",
                                   "role", "epoch", "max_offset", "confirm_offset", "lag_bytes"}]}],
     "topics": [{"name", "messages", "produce_messages_per_s"}],
     "groups": [{"group", "topic", "committed", "lag", "consume_messages_per_s"}],
     "errors": ["<what could not be read>"]}

A member's `role` is the broker's own answer (master, slave, none), `unreachable` when it did not
answer, or `gone` when another broker id answers at its address. `lag_bytes` is how far its log
ends behind the master's (physical offsets are the same bytes on every replica). Rates are null
without an earlier snapshot, and when a counter went down between the two (a truncated tail, a
topic deleted and created again): a rate is never negative and never made up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import controller_pb2 as cpb

SCHEMA_VERSION = 1
MIN_WINDOW_S = 0.001  # a rate over less time than this says nothing (and may overflow a float)
_GROUP_KEY = "group/"
_TOPICS_PART = "topics/"


@dataclass(frozen=True)
class Member:
    broker_id: int
    address: str
    datacenter: str
    alive: bool | None  # None: the answering controller does not hold the heartbeats
    in_sync: bool
    role: str
    epoch: int | None = None
    max_offset: int | None = None
    confirm_offset: int | None = None


@dataclass(frozen=True)
class BrokerSet:
    name: str
    master: int | None
    epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    members: tuple[Member, ...]

    @property
    def head(self) -> int | None:
        """Where the set's log ends: the master's max offset, else the furthest member's."""
        for m in self.members:
            if m.broker_id == self.master and m.max_offset is not None:
                return m.max_offset
        known = [m.max_offset for m in self.members if m.max_offset is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class Topic:
    name: str
    messages: int  # the sum of its queues' max queue offsets: messages ever written


@dataclass(frozen=True)
class Group:
    group: str
    topic: str
    committed: int  # the sum of the committed offsets of its queues (0 where none)
    lag: int  # confirmed messages not consumed yet, over all queues


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # seconds on a monotonic clock: only differences mean anything
    wall: float  # seconds since the epoch, for the `time` field
    liveness_known: bool
    broker_sets: tuple[BrokerSet, ...]
    topics: tuple[Topic, ...] = ()
    groups: tuple[Group, ...] = ()
    errors: tuple[str, ...] = field(default=())


def member(m: cpb.MemberInfo, liveness_known: bool, status: bpb.StatusReply | None) -> Member:
    """One member from the controller's description and its broker's Status (None: no answer)."""
    base = Member(
        broker_id=m.broker_id,
        address=m.address,
        datacenter=m.datacenter,
        alive=m.alive if liveness_known else None,
        in_sync=m.in_sync,
        role="unreachable",
    )
    if status is None:
        return base
    if status.broker_id != m.broker_id:
        # a wiped replica back under a new id answers at this address: this id is gone
        return dataclasses.replace(base, role="gone")
    return dataclasses.replace(
        base,
        role=status.role,
        epoch=status.last_epoch,
        max_offset=status.max_offset,
        confirm_offset=status.confirm_offset,
    )


def broker_set(
    info: cpb.BrokerSetInfo, liveness_known: bool, statuses: Mapping[int, bpb.StatusReply | None]
) -> BrokerSet:
    """A broker set from `DescribeBrokerSets` and its members' Status answers, by broker id."""
    role = info.role
    return BrokerSet(
        name=role.broker_set,
        master=role.master_id if role.has_master else None,
        epoch=role.master_epoch,
        sync_state_set=tuple(sorted(role.sync_state_set)),
        sync_state_set_epoch=role.sync_state_set_epoch,
        members=tuple(
            member(m, liveness_known, statuses.get(m.broker_id))
            for m in sorted(info.members, key=lambda m: m.broker_id)
        ),
    )


def group_topics(keys: Iterable[str]) -> list[tuple[str, str]]:
    """(group, topic) pairs from the controller metadata keys `group/<group>/topics/<topic>`."""
    out = set()
    for key in keys:
        if not key.startswith(_GROUP_KEY):
            continue
        # group names hold no '/' (client/aio.py refuses them); topic names come after "topics/"
        group, _, rest = key[len(_GROUP_KEY) :].partition("/")
        if group and rest.startswith(_TOPICS_PART) and len(rest) > len(_TOPICS_PART):
            out.add((group, rest[len(_TOPICS_PART) :]))
    return sorted(out)


def rate(before: int | None, after: int | None, seconds: float) -> float | None:
    """Units per second between two readings of a counter; None when it cannot be told."""
    if before is None or after is None or seconds < MIN_WINDOW_S or after < before:
        return None
    return (after - before) / seconds


def _members_doc(bs: BrokerSet) -> list[dict[str, Any]]:
    head = next(
        (m.max_offset for m in bs.members if m.broker_id == bs.master and m.max_offset is not None), None
    )
    return [
        {
            "broker_id": m.broker_id,
            "address": m.address,
            "datacenter": m.datacenter,
            "alive": m.alive,
            "in_sync": m.in_sync,
            "role": m.role,
            "epoch": m.epoch,
            "max_offset": m.max_offset,
            "confirm_offset": m.confirm_offset,
            "lag_bytes": None if head is None or m.max_offset is None else max(0, head - m.max_offset),
        }
        for m in bs.members
    ]


def _broker_sets_doc(cur: Snapshot, prev: Snapshot | None, dt: float) -> list[dict[str, Any]]:
    before = {b.name: b.head for b in prev.broker_sets} if prev else {}
    return [
        {
            "name": bs.name,
            "master": bs.master,
            "epoch": bs.epoch,
            "sync_state_set": list(bs.sync_state_set),
            "sync_state_set_epoch": bs.sync_state_set_epoch,
            "max_offset": bs.head,
            "produce_bytes_per_s": rate(before.get(bs.name), bs.head, dt),
            "members": _members_doc(bs),
        }
        for bs in cur.broker_sets
    ]


def _topics_doc(cur: Snapshot, prev: Snapshot | None, dt: float) -> list[dict[str, Any]]:
    before = {t.name: t.messages for t in prev.topics} if prev else {}
    return [
        {
            "name": t.name,
            "messages": t.messages,
            "produce_messages_per_s": rate(before.get(t.name), t.messages, dt),
        }
        for t in cur.topics
    ]


def _groups_doc(cur: Snapshot, prev: Snapshot | None, dt: float) -> list[dict[str, Any]]:
    before = {(g.group, g.topic): g.committed for g in prev.groups} if prev else {}
    return [
        {
            "group": g.group,
            "topic": g.topic,
            "committed": g.committed,
            "lag": g.lag,
            "consume_messages_per_s": rate(before.get((g.group, g.topic)), g.committed, dt),
        }
        for g in cur.groups
    ]


def iso_utc(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


def view(cur: Snapshot, prev: Snapshot | None = None) -> dict[str, Any]:
    """The document `tide top` shows and `--json` prints: `cur`, with rates since `prev`."""
    dt = cur.taken_at - prev.taken_at if prev is not None else 0.0
    return {
        "version": SCHEMA_VERSION,
        "time": iso_utc(cur.wall),
        "rate_window_s": round(dt, 3) if prev is not None else None,
        "liveness_known": cur.liveness_known,
        "broker_sets": _broker_sets_doc(cur, prev, dt),
        "topics": _topics_doc(cur, prev, dt),
        "groups": _groups_doc(cur, prev, dt),
        "errors": list(cur.errors),
    }


def member_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table row per member of every broker set in `view`'s document."""
    rows = []
    for bs in doc["broker_sets"]:
        for m in bs["members"]:
            rows.append(
                {
                    "broker_set": bs["name"],
                    "broker": m["broker_id"],
                    "role": m["role"],
                    "alive": _yes_no(m["alive"]),
                    "datacenter": m["datacenter"] or "-",
                    "epoch": m["epoch"],
                    "in_sss": _yes_no(m["broker_id"] in bs["sync_state_set"]),
                    "max_offset": m["max_offset"],
                    "confirm_offset": m["confirm_offset"],
                    "lag_bytes": m["lag_bytes"],
                    "produce": human_rate(bs["produce_bytes_per_s"], "B")
                    if m["broker_id"] == bs["master"]
                    else "",
                }
            )
    return rows


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else "yes" if value else "no"


def human_rate(per_s: float | None, unit: str) -> str:
    """`12.3 kB/s`-style text for a rate (`-` when unknown)."""
    if per_s is None:
        return "-"
    for prefix in ("", "k", "M", "G"):
        if per_s < 1000 or prefix == "G":
            return f"{per_s:.1f} {prefix}{unit}/s"
        per_s /= 1000
    return "-"  # not reached: the loop returns at "G"


def sums(rows: Sequence[Mapping[str, Any]], key: str) -> int:
    """The sum of `key` over rows, counting a missing value as 0."""
    return sum(int(r.get(key) or 0) for r in rows)
