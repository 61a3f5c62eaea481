"""Consumer-group membership (pure; time passed in).

Members announce themselves in the controller's metadata store under
`group/<group>/members/<member id>` with the time of their last announcement, their topic, their
subscription mode and the time of their first announcement (client/modes.py). A member is live if
it announced within the session timeout. Which live member reads which queue
is decided from the live members and the queues' owner keys (client/handover.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tidelog.client.modes import CLUSTERING, MODES, Announced

MEMBERS_PREFIX = "group/{group}/members/"
# One key per topic a group has ever consumed; it outlives the members (for `tide group describe`).
TOPICS_PREFIX = "group/{group}/topics/"


def members_prefix(group: str) -> str:
    return MEMBERS_PREFIX.format(group=group)


def topics_prefix(group: str) -> str:
    return TOPICS_PREFIX.format(group=group)


def announcement(now_ms: int, topic: str, mode: str = CLUSTERING, since_ms: int | None = None) -> bytes:
    return json.dumps(
        {"ts": now_ms, "topic": topic, "mode": mode, "since": now_ms if since_ms is None else since_ms}
    ).encode()


def live_announced(
    entries: Iterable[tuple[str, bytes]],
    prefix: str,
    now_ms: int,
    session_timeout_ms: int,
    topic: str | None = None,
) -> dict[str, Announced]:
    """Members whose last announcement is recent enough (and, given `topic`, that read it), with
    their mode and first announcement. An announcement without a mode is a clustering member's.

    Members of one group may read different topics; each topic's queues are shared only among
    the members that read it, or queues would go to members that never poll them.
    """
    out = {}
    for key, value in entries:
        try:
            doc = json.loads(value)
            ts = int(doc["ts"])
            since = int(doc.get("since", ts))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        mode = doc.get("mode", CLUSTERING)
        if mode not in MODES or (topic is not None and doc.get("topic") != topic):
            continue
        if now_ms - ts <= session_timeout_ms:
            out[key[len(prefix) :]] = Announced(mode, since)
    return out


def live_members(
    entries: Iterable[tuple[str, bytes]],
    prefix: str,
    now_ms: int,
    session_timeout_ms: int,
    topic: str | None = None,
) -> list[str]:
    """The ids of `live_announced`, sorted."""
    return sorted(live_announced(entries, prefix, now_ms, session_timeout_ms, topic))


def groups_reading(
    entries: Iterable[tuple[str, bytes]], topic: str, now_ms: int, within_ms: int
) -> list[str]:
    """Groups with a member whose announcement names `topic` and is at most `within_ms` old,
    from metadata entries under `group/` (other keys are ignored), sorted."""
    groups = set()
    for key, value in entries:
        group, sep, member = key.removeprefix("group/").rpartition("/members/")
        if not sep or not group or not member or not key.startswith("group/"):
            continue
        if live_members([(key, value)], key[: len(key) - len(member)], now_ms, within_ms, topic):
            groups.add(group)
    return sorted(groups)
