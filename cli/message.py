"""`tide message get|find`: one message by queue position or id, or the messages of a key.

Bodies are printed as UTF-8 when they are valid UTF-8 and as base64 otherwise, with
`body_encoding` saying which, so that any body survives a round trip through `--json`.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import click

from tidelog.cli.common import controllers_option, emit, json_option, open_client
from tidelog.client import ConsumedMessage
from tidelog.commitlog.keyformat import format_message_id

COLUMNS = ["message_id", "queue", "offset", "key", "store_ts", "body_encoding", "body"]


def message_row(m: ConsumedMessage) -> dict[str, Any]:
    """One message as plain data: every field a user can act on, the body safely printable."""
    body = m.body
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode(), "base64"
    return {
        "message_id": format_message_id(m.broker_set, m.phys_offset),
        "topic": m.topic,
        "broker_set": m.broker_set,
        "queue": m.queue,
        "offset": m.offset,
        "key": m.key,
        "tags": m.tags,
        "properties": dict(m.properties),
        "born_ts": m.born_ts,
        "store_ts": m.store_ts,
        "body_encoding": encoding,
        "body": text,
    }


def _time_ms(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A time given as ms since the epoch or as an ISO 8601 date/time (local time if no zone)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give ms since the epoch or an ISO 8601 time") from None


@click.group("message")
def message() -> None:
    """Find messages: by queue and offset, by message id, by key."""


@message.command("get")
@click.option("--topic", "topic_name", default=None, help="the topic (with --queue and --offset)")
@click.option("--queue", type=click.IntRange(min=0), default=None, help="queue id within the broker set")
@click.option("--offset", type=click.IntRange(min=0), default=None, help="queue offset")
@click.option("--broker-set", default=None, help="the queue's broker set (needed when the topic has several)")
@click.option("--id", "message_id", default=None, help="a message id, as a send's receipt gives it")
@controllers_option
@json_option
def message_get(
    topic_name: str | None,
    queue: int | None,
    offset: int | None,
    broker_set: str | None,
    message_id: str | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Print one confirmed message: `--id ID`, or `--topic T --queue Q --offset O`."""
    by_position = (topic_name, queue, offset)
    if message_id is not None:
        if any(v is not None for v in (*by_position, broker_set)):
            raise click.UsageError("--id names the message alone: leave out --topic, --queue, --offset")
    elif any(v is None for v in by_position):
        raise click.UsageError("say which message: --id ID, or --topic, --queue and --offset")
    with open_client(controllers) as c:
        if message_id is not None:
            found = c.get_message_by_id(message_id)
        elif topic_name is not None and queue is not None and offset is not None:
            found = c.get_message(topic_name, queue, offset, broker_set=broker_set)
        else:
            raise click.UsageError("say which message: --id ID, or --topic, --queue and --offset")
    emit(message_row(found), as_json, title="message")


@message.command("find")
@click.option("--topic", "topic_name", required=True, help="the topic")
@click.option("--key", required=True, help="the key the messages were sent with")
@click.option("--begin", callback=_time_ms, default=None, help="stored at or after (ms or ISO 8601)")
@click.option("--end", callback=_time_ms, default=None, help="stored at or before (ms or ISO 8601)")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=32, show_default=True)
@controllers_option
@json_option
def message_find(
    topic_name: str,
    key: str,
    begin: int | None,
    end: int | None,
    max_messages: int,
    controllers: str,
    as_json: bool,
) -> None:
    """Print the confirmed messages of TOPIC sent with KEY, newest first."""
    if not key:
        raise click.UsageError("--key must not be empty")
    if begin is not None and end is not None and end < begin:
        raise click.UsageError("--end is before --begin")
    with open_client(controllers) as c:
        found = c.find_messages(topic_name, key, begin_ts=begin, end_ts=end, max_messages=max_messages)
    emit([message_row(m) for m in found], as_json, title=f"{topic_name} key {key}", columns=COLUMNS)
