"""The client's pure rules: group membership, assignment and queue choice (no processes)."""

from __future__ import annotations

import json

import pytest

from tidelog.client import assign as asg
from tidelog.client import handover as ho
from tidelog.client.routing import BrokerSetRoute, Replica, TopicRoute, queue_for_key, queue_round_robin


@pytest.mark.parametrize("n_members", range(1, 6))
@pytest.mark.parametrize("n_queues", [1, 2, 3, 4, 7, 12])
def test_assignment_partitions_the_queues(n_members: int, n_queues: int) -> None:
    members = [f"m{i}" for i in range(n_members)]
    queues = [("broker-b", q) for q in range(n_queues // 2)] + [
        ("broker-a", q) for q in range(n_queues - n_queues // 2)
    ]
    target = ho.sticky_assign(list(reversed(members)), queues, {})
    owned = [[q for q, o in target.items() if o == m] for m in members]
    flat = [q for o in owned for q in o]
    assert sorted(flat) == sorted(queues) and len(flat) == len(set(flat))
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    assert "stranger" not in target.values()


def test_live_members_by_session_timeout_and_topic() -> None:
    prefix = asg.members_prefix("g")
    entries = [
        (prefix + "a", asg.announcement(10_000, "t")),
        (prefix + "b", asg.announcement(4_000, "t")),  # last seen 6 s ago
        (prefix + "c", asg.announcement(9_000, "other")),
        (prefix + "d", b"not json"),
        (prefix + "e", json.dumps({"topic": "t"}).encode()),
    ]
    assert asg.live_members(entries, prefix, 10_000, 5_000) == ["a", "c"]
    assert asg.live_members(entries, prefix, 10_000, 6_000, "t") == ["a", "b"]
    assert asg.live_members(entries, prefix, 10_000, 6_000, "other") == ["c"]
    assert asg.topics_prefix("g") != prefix and not prefix.startswith(asg.topics_prefix("g"))


def _route(*sets: tuple[str, int, bool]) -> TopicRoute:
    return TopicRoute.build(
        "t",
        [
            BrokerSetRoute(name, n, f"{name}:1" if master else "", 1, (Replica(1, f"{name}:1", master),))
            for name, n, master in sets
        ],
    )


def test_a_key_maps_to_one_queue_whatever_the_masters() -> None:
    up = _route(("broker-b", 4, True), ("broker-a", 4, True))
    down = _route(("broker-a", 4, True), ("broker-b", 4, False))
    assert (
        up.queue_list == down.queue_list == tuple((s, q) for s in ("broker-a", "broker-b") for q in range(4))
    )
    for i in range(200):
        assert queue_for_key(up, f"k{i}") == queue_for_key(down, f"k{i}")
    assert len({queue_for_key(up, f"k{i}") for i in range(200)}) == 8


def test_round_robin_skips_sets_without_a_master_and_avoided_ones() -> None:
    route = _route(("broker-a", 2, True), ("broker-b", 2, False), ("broker-c", 2, True))
    picks = [queue_round_robin(route, i) for i in range(8)]
    assert {s for s, _ in picks} == {"broker-a", "broker-c"}
    assert {queue_round_robin(route, i, frozenset({"broker-a"}))[0] for i in range(4)} == {"broker-c"}
    # When every set is avoided, any set with a master still beats giving up.
    assert queue_round_robin(route, 0, frozenset({"broker-a", "broker-c"}))[0] in {"broker-a", "broker-c"}


def test_groups_reading_names_the_groups_with_a_recent_member_on_the_topic() -> None:
    from tidelog.client.assign import announcement, groups_reading

    entries = [
        ("group/g1/members/m1", announcement(10_000, "t")),
        ("group/g2/members/m1", announcement(1_000, "t")),  # too old
        ("group/g3/members/m1", announcement(10_000, "other")),
        ("group/g4/topics/t", b""),  # not a member key
        ("group/g5/members/m1", b"not json"),
        ("group/a/members/b/members/m", announcement(10_000, "t")),  # a group named a/members/b
    ]
    assert groups_reading(entries, "t", now_ms=12_000, within_ms=5_000) == ["a/members/b", "g1"]
    assert groups_reading(entries, "t", now_ms=12_000, within_ms=20_000) == ["a/members/b", "g1", "g2"]
