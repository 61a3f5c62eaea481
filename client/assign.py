"""Consumer-group membership (pure; time passed in).

Members announce themselves in the controller's metadata store under
`group/<group>/members/<member id>` with the time of their last announcement, their topic, their
session timeout, their subscription mode and the time of their first announcement
(client/modes.py). A member is live if it announced within the session timeout. Which live member
reads which queue is decided from the live members and the queues' owner keys
(client/handover.py). An operator's command that must not run under live members (resetting or
deleting the group's offsets) judges each member by the session timeout it announced
(`active_members`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tidelog.client.modes import CLUSTERING, MODES, Announced
from tidelog.errors import InvalidArgumentError

MEMBERS_PREFIX = "group/{group}/members/"
# One key per topic a group has ever consumed; it outlives the members (for `tide group describe`).
TOPICS_PREFIX = "group/{group}/topics/"
GROUP_PREFIX = "group/{group}/"  # every key of a group: members, topics, owner keys
# The session timeout of a member that did not announce one (`AsyncConsumer`'s default).
DEFAULT_SESSION_MS = 6000


def members_prefix(group: str) -> str:
    return MEMBERS_PREFIX.format(group=group)


def topics_prefix(group: str) -> str:
    return TOPICS_PREFIX.format(group=group)


def check_group_name(group: str) -> None:
    """A group name is a key segment of the metadata store: not empty, no '/'; no '@' either (a
    broadcast member keeps its own state under `<group>@<member id>`, client/modes.py)."""
    if not group or "/" in group or "@" in group:
        raise InvalidArgumentError("group must be a non-empty name without '/' or '@'")


def group_prefix(group: str) -> str:
    return GROUP_PREFIX.format(group=group)


def announcement(
    now_ms: int,
    topic: str,
    session_ms: int | None = None,
    mode: str = CLUSTERING,
    since_ms: int | None = None,
) -> bytes:
    doc: dict[str, object] = {"ts": now_ms, "topic": topic, "mode": mode}
    doc["since"] = now_ms if since_ms is None else since_ms
    if session_ms is not None:
        doc["session_ms"] = session_ms
    return json.dumps(doc).encode()


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


def modes(entries: Iterable[tuple[str, bytes]], prefix: str) -> dict[str, str]:
    """Member id -> the subscription mode its announcement names (clustering if none)."""
    out = {}
    for key, value in entries:
        try:
            mode = json.loads(value).get("mode", CLUSTERING)
        except (ValueError, AttributeError):
            continue
        if key.startswith(prefix) and mode in MODES:
            out[key[len(prefix) :]] = mode
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


def active_members(
    entries: Iterable[tuple[str, bytes]], prefix: str, now_ms: int, topics: Iterable[str] | None = None
) -> dict[str, str]:
    """Member id -> topic of the members under `prefix` that are live by the session timeout each
    announced (DEFAULT_SESSION_MS if none), and that read one of `topics` if given."""
    wanted = None if topics is None else set(topics)
    out = {}
    for key, value in entries:
        try:
            doc = json.loads(value)
            ts, topic = int(doc["ts"]), str(doc["topic"])
            session_ms = int(doc.get("session_ms", DEFAULT_SESSION_MS))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if key.startswith(prefix) and (wanted is None or topic in wanted) and now_ms - ts <= session_ms:
            out[key[len(prefix) :]] = topic
    return dict(sorted(out.items()))
