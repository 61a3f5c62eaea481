"""`tide group describe|reset-offsets|delete`: consumer groups, thin over tidelog.client's admin.

The rules (what a reset sets, when it is refused) are client/resetplan.py and
client/groupadmin.py; this module parses options and prints.
"""

from __future__ import annotations

from typing import Any

import click

from tidelog.cli.common import controllers_option, emit, json_option, open_client
from tidelog.client import Client
from tidelog.client.resetplan import TARGETS, member_lag


@click.group("group")
def group() -> None:
    """Consumer groups: describe them, reset their offsets, delete them."""


def _only_topic(c: Client, name: str) -> str:
    topics: list[str] = c.admin().group_topics(name)
    if len(topics) != 1:
        found = "no members" if not topics else "members on " + ", ".join(topics)
        raise click.UsageError(f"group {name} has {found}: name the topic with --topic")
    return topics[0]


@group.command("describe")
@click.argument("name")
@click.option(
    "--topic", "topic_name", default=None, help="the topic (default: the one its live members read)"
)
@controllers_option
@json_option
def group_describe(name: str, topic_name: str | None, controllers: str, as_json: bool) -> None:
    """Committed offset, lag and owning member per queue for group NAME, and per member the
    queues it holds, their total lag and its subscription mode. `--json`: {"queues": [...],
    "members": [...]}."""
    with open_client(controllers) as c:
        c.admin().require_group(name, topic_name)
        topic_name = topic_name or _only_topic(c, name)
        rows = c.admin().group_lag(name, topic_name)
        live = c.admin().group_members(name, topic_name)
        modes = c.admin().group_modes(name)
    members = [{**m, "mode": modes.get(m["member"], "clustering")} for m in member_lag(rows, live)]
    if as_json:
        emit({"group": name, "topic": topic_name, "queues": rows, "members": members}, True)
        return
    emit(
        rows,
        False,
        title=f"group {name} on {topic_name}",
        columns=["broker_set", "queue", "committed", "confirmed", "lag", "owner"],
    )
    shown = [{**m, "queues": " ".join(m["queues"]) or "-"} for m in members]
    emit(
        shown,
        False,
        title=f"members of {name} on {topic_name}",
        columns=["member", "mode", "queues", "lag", "live"],
    )


@group.command("reset-offsets")
@click.argument("name")
@click.option("--topic", "topic_name", required=True, help="the topic whose offsets move")
@click.option("--to", "to", required=True, type=click.Choice(TARGETS), help="where each queue goes")
@click.option(
    "--timestamp",
    default=None,
    help="with --to timestamp: epoch ms or ISO-8601 (no offset: UTC); each queue goes to its "
    "first message stored at or after it",
)
@click.option(
    "--offset", type=int, default=None, help="with --to offset: the offset every selected queue gets"
)
@click.option("--queue", type=int, default=None, help="only queues with this id")
@click.option("--broker-set", "broker_sets", multiple=True, help="only queues of these broker sets")
@click.option(
    "--force", is_flag=True, help="even while the group has live members (they restart their queues)"
)
@click.option(
    "--dry-run", is_flag=True, help="only show the offsets each queue would get (also while members are live)"
)
@controllers_option
@json_option
def group_reset_offsets(
    name: str,
    topic_name: str,
    to: str,
    timestamp: str | None,
    offset: int | None,
    queue: int | None,
    broker_sets: tuple[str, ...],
    force: bool,
    dry_run: bool,
    controllers: str,
    as_json: bool,
) -> None:
    """Set group NAME's committed offsets of TOPIC: to the earliest or latest (confirmed) offset,
    to the first message stored at or after --timestamp, or to --offset. Every queue is checked
    first; if any would land outside its min..confirmed range, nothing is changed. Refused while
    the group has live members unless --force."""
    with open_client(controllers) as c:
        out: dict[str, Any] = c.admin().reset_offsets(
            name,
            topic_name,
            to,
            offset=offset,
            timestamp=timestamp,
            queue=queue,
            broker_sets=broker_sets,
            force=force,
            dry_run=dry_run,
        )
    if as_json:
        emit(out, True)
        return
    done = "would be set (dry run: nothing was changed)" if dry_run else "set"
    emit(
        out["queues"],
        False,
        title=f"group {name} on {topic_name}: offsets {done}, to {to}",
        columns=["broker_set", "queue", "before", "after"],
    )


@group.command("delete")
@click.argument("name")
@click.option("--topic", "topic_name", default=None, help="only the group's offsets of this topic")
@click.option("--force", is_flag=True, help="even while the group has live members")
@controllers_option
@json_option
def group_delete(name: str, topic_name: str | None, force: bool, controllers: str, as_json: bool) -> None:
    """Delete group NAME's committed offsets (of --topic, else of every topic) and its owner
    keys: its next member starts from its configured start. Refused while the group has live
    members unless --force."""
    with open_client(controllers) as c:
        out: dict[str, Any] = c.admin().delete_group(name, topic_name, force=force)
    if as_json:
        emit(out, True)
        return
    emit(
        out["deleted"],
        False,
        title=f"group {name}: committed offsets deleted",
        columns=["broker_set", "topic", "queue", "offset"],
    )
