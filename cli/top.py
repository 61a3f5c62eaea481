"""`tide top`: a live terminal view of the cluster, refreshed every second (`--once`, `--json`).

This module only asks and draws: the controllers describe the broker sets (`DescribeBrokerSets`),
every member answers `Status`, topics are listed with their queues' offsets and each consumer
group's committed offsets are read (`cli/topmodel.py` turns the answers into a snapshot
and two snapshots into rates; its docstring gives the `--json` shape). Nothing here reads
Prometheus: what is shown is what the cluster serves to every client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tidelog.cli import topmodel as model
from tidelog.cli.common import controllers_option, json_option, require_controllers
from tidelog.client.aio import AsyncAdmin, AsyncClient
from tidelog.client.controllers import parse_addresses
from tidelog.errors import TidelogError, TopicNotFoundError, UnavailableError
from tidelog.proto import broker_pb2 as bpb

STATUS_TIMEOUT_S = 2.0  # a broker that has not answered Status by then is shown unreachable
SLOW_START_S = 1.0  # no controller answer by then: say which ones are being asked
_TEXT_COLUMNS = {"broker_set", "role", "alive", "datacenter", "in_sss", "topic", "group"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def _status(client: AsyncClient, address: str) -> bpb.StatusReply | None:
    try:
        reply: bpb.StatusReply = await client.call_broker(
            address, "Status", bpb.StatusRequest(), timeout=STATUS_TIMEOUT_S
        )
    except TidelogError:
        return None
    return reply


async def _broker_sets(client: AsyncClient) -> tuple[bool, tuple[model.BrokerSet, ...]]:
    reply = await client.controller.describe_broker_sets()
    members = [(b, m) for b in reply.broker_sets for m in b.members]
    answers = await asyncio.gather(*(_status(client, m.address) for _, m in members))
    by_set: dict[str, dict[int, bpb.StatusReply | None]] = {}
    for (b, m), answer in zip(members, answers, strict=True):
        by_set.setdefault(b.role.broker_set, {})[m.broker_id] = answer
    sets = tuple(
        model.broker_set(b, reply.liveness_known, by_set.get(b.role.broker_set, {}))
        for b in sorted(reply.broker_sets, key=lambda b: b.role.broker_set)
    )
    return reply.liveness_known, sets


async def _topic(admin: AsyncAdmin, name: str) -> model.Topic:
    return model.Topic(name, model.sums(await admin.describe_topic(name), "max"))


async def _group(admin: AsyncAdmin, group: str, topic: str) -> model.Group:
    rows = await admin.group_lag(group, topic)
    return model.Group(group, topic, model.sums(rows, "committed"), model.sums(rows, "lag"))


def _kept(labels: list[str], results: list[Any], errors: list[str]) -> list[Any]:
    """The answers that came; a failure becomes a line of `errors` (a deleted topic: nothing)."""
    out = []
    for label, result in zip(labels, results, strict=True):
        if isinstance(result, TopicNotFoundError):
            continue  # deleted since it was listed, or a group's topic that is gone
        if isinstance(result, Exception):
            errors.append(f"{label}: {_first_line(result)}")
        else:
            out.append(result)
    return out


async def _topics(client: AsyncClient, errors: list[str]) -> tuple[model.Topic, ...]:
    names = sorted(t.name for t in await client.controller.list_topics())
    admin = client.admin()
    results = await asyncio.gather(*(_topic(admin, n) for n in names), return_exceptions=True)
    return tuple(_kept([f"topic {n}" for n in names], list(results), errors))


async def _groups(client: AsyncClient, errors: list[str]) -> tuple[model.Group, ...]:
    entries = await client.controller.meta_list("group/")
    pairs = model.group_topics(e.key for e in entries)
    admin = client.admin()
    results = await asyncio.gather(*(_group(admin, g, t) for g, t in pairs), return_exceptions=True)
    return tuple(_kept([f"group {g} on {t}" for g, t in pairs], list(results), errors))


async def snapshot(client: AsyncClient, *, groups: bool) -> model.Snapshot:
    """One reading of the cluster. Raises when no controller answers; a broker, topic or group
    that cannot be read is shown as such (unreachable, or a line of `errors`)."""
    taken_at, wall = time.monotonic(), time.time()
    liveness_known, sets = await _broker_sets(client)
    errors: list[str] = []
    try:
        topics = await _topics(client, errors)
        found = await _groups(client, errors) if groups else ()
    except TidelogError as exc:
        errors.append(f"topics and groups: {_first_line(exc)}")
        topics, found = (), ()
    return model.Snapshot(taken_at, wall, liveness_known, sets, topics, found, tuple(errors))


# --- drawing --------------------------------------------------------------------------------------


def _table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c.replace("_", " "), justify="left" if c in _TEXT_COLUMNS else "right")
    for r in rows:
        table.add_row(*("-" if r.get(c) is None else str(r.get(c)) for c in columns))
    return table


def render(doc: dict[str, Any], note: str = "") -> Group:
    """One frame: the broker sets' members, the topics' produce rates, the groups' lag."""
    window = doc["rate_window_s"]
    head = f"tide top  {doc['time']}" + (f"  rates over {window:.1f}s" if window else "")
    if not doc["liveness_known"]:
        head += "  (liveness unknown: answered by a controller follower)"
    parts: list[Any] = [Text(head, style="bold")]
    rows = model.member_rows(doc)
    parts.append(_table("broker sets", rows, list(rows[0]) if rows else ["broker_set"]))
    topics = [
        {
            "topic": t["name"],
            "messages": t["messages"],
            "rate": model.human_rate(t["produce_messages_per_s"], "msg"),
        }
        for t in doc["topics"]
    ]
    if topics:
        parts.append(_table("topics", topics, ["topic", "messages", "rate"]))
    groups = [
        {**g, "consume_rate": model.human_rate(g["consume_messages_per_s"], "msg")} for g in doc["groups"]
    ]
    if groups:
        parts.append(
            _table("consumer groups", groups, ["group", "topic", "committed", "lag", "consume_rate"])
        )
    for line in [*doc["errors"], *([note] if note else [])]:
        parts.append(Text(line, style="red"))
    return Group(*parts)


def _console() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=160)  # piped: a whole table row per line, not 80 folded columns
    return console


# --- the command ----------------------------------------------------------------------------------


async def _first(client: AsyncClient, addresses: list[str], timeout: float, groups: bool) -> model.Snapshot:
    """The first snapshot; a cluster that does not answer is one line naming what was tried."""
    tried = ", ".join(addresses)
    note = asyncio.get_running_loop().call_later(
        SLOW_START_S, lambda: click.echo(f"asking the controllers at {tried} (up to {timeout:g}s)", err=True)
    )
    try:
        return await snapshot(client, groups=groups)
    except UnavailableError as exc:
        raise click.ClickException(
            f"no controller answered (tried {tried} for {timeout:g}s): {_first_line(exc)}"
        ) from None
    except TidelogError as exc:
        raise click.ClickException(
            f"the controllers at {tried} could not describe the cluster: {_first_line(exc)}"
        ) from None
    finally:
        note.cancel()


async def _live(client: AsyncClient, prev: model.Snapshot, interval: float, groups: bool) -> None:
    doc = model.view(prev)
    with Live(render(doc), console=_console(), auto_refresh=False) as live:
        while True:
            await asyncio.sleep(interval)
            try:
                cur = await snapshot(client, groups=groups)
            except TidelogError as exc:  # keep the last frame, say why it is old, try again
                live.update(render(doc, f"refresh failed: {_first_line(exc)}"), refresh=True)
                continue
            doc = model.view(cur, prev)
            live.update(render(doc), refresh=True)
            prev = cur


async def _run(
    controllers: str, interval: float, once: bool, as_json: bool, groups: bool, timeout: float
) -> None:
    addresses = parse_addresses(controllers)
    async with AsyncClient(controllers) as client:
        client.controller.total_timeout = timeout
        first = await _first(client, addresses, timeout, groups)
        if not (once or as_json):
            await _live(client, first, interval, groups)
            return
        await asyncio.sleep(interval)  # a second reading, so that the one frame has rates
        doc = model.view(await _first(client, addresses, timeout, groups), first)
        if as_json:
            click.echo(json.dumps(doc, indent=2, sort_keys=True))
        else:
            _console().print(render(doc))


@click.command("top")
@controllers_option
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="seconds between refreshes, and the window the rates are measured over",
)
@click.option("--once", is_flag=True, help="print one frame (rates over one interval) and exit")
@click.option(
    "--groups/--no-groups",
    default=True,
    show_default=True,
    help="consumer lag per group (two calls per queue of each group's topic)",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="seconds to find an answering controller",
)
@json_option
def top(controllers: str, interval: float, once: bool, groups: bool, timeout: float, as_json: bool) -> None:
    """Broker sets, roles, epochs, SyncStateSets, offsets, replication lag, produce rates and
    consumer lag, refreshed every --interval seconds until Ctrl-C. `--json`: one snapshot (rates
    over one interval) as JSON."""
    require_controllers(controllers)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a live view ends
        asyncio.run(_run(controllers, interval, once, as_json, groups, timeout))
