"""`tide topic|produce|consume`: the client-facing commands, thin over tidelog.client
(`tide group` is cli/groups.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import click

from tidelog.cli.common import (
    controllers_option,
    emit,
    json_option,
    open_client,
    progress,
    quiet_option,
)
from tidelog.cli.durations import format_retention, retention_option
from tidelog.client import OutMessage, Producer, Receipt
from tidelog.commitlog import record as rec
from tidelog.dataport_frames import produce_room
from tidelog.errors import MessageTooLargeError, TopicInUseError

_RETENTION_HELP = (
    "how long its messages stay readable: 30s, 15m, 2h, 7d; 0 or default: the brokers' retention_ms"
)


@click.group("topic")
def topic() -> None:
    """Create, list, describe, grow and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("--queues", default=4, show_default=True, help="queues in each broker set")
@click.option("--broker-set", "broker_sets", multiple=True, help="only these broker sets (default: all)")
@click.option(
    "--retention", default="default", metavar="DURATION", callback=retention_option, help=_RETENTION_HELP
)
@controllers_option
@json_option
def topic_create(
    name: str, queues: int, broker_sets: tuple[str, ...], retention: int, controllers: str, as_json: bool
) -> None:
    """Create topic NAME with QUEUES queues in each broker set."""
    with open_client(controllers) as c:
        result = c.admin().create_topic(
            name, queues=queues, broker_sets=broker_sets or None, retention_ms=retention
        )
    emit(
        {
            "topic": name,
            "queues": result,
            "retention_ms": retention,
            "retention": format_retention(retention),
        },
        as_json,
        title=f"topic {name}",
    )


@topic.command("list")
@click.option("--prefix", default="", help="only topics whose name begins with this")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="at most this many topics, in name order (0: all)",
)
@click.option("--start-after", default="", metavar="NAME", help="the page after this name")
@controllers_option
@json_option
def topic_list(prefix: str, limit: int, start_after: str, controllers: str, as_json: bool) -> None:
    """List topics, their queues per broker set and their retention, a page at a time (the next
    page's --start-after is printed on standard error when there is one)."""
    with open_client(controllers) as c:
        admin = c.admin()
        if limit:
            rows, after = admin.list_topics_page(prefix=prefix, start_after=start_after, limit=limit)
        else:
            rows, after = (
                [r for r in admin.list_topics() if r["name"].startswith(prefix) and r["name"] > start_after],
                "",
            )
    for row in rows:
        row["retention"] = format_retention(row["retention_ms"])
    emit(rows, as_json, title="topics", columns=["name", "queues", "perm", "retention"])
    if after:
        click.echo(f"more topics: the next page is --start-after {after}", err=True)


@topic.command("describe")
@click.argument("name")
@controllers_option
@json_option
def topic_describe(name: str, controllers: str, as_json: bool) -> None:
    """Per queue: min, max and confirmed offsets, and the topic's retention (`broker`: the
    brokers' retention_ms). `min` moves forward as retention removes old messages."""
    with open_client(controllers) as c:
        admin = c.admin()
        retention = admin.topic_retention(name)
        rows = admin.describe_topic(name)
    for row in rows:
        row["retention_ms"] = retention
        row["retention"] = format_retention(retention)
    emit(
        rows,
        as_json,
        title=f"topic {name} (retention {format_retention(retention)})",
        columns=["broker_set", "queue", "min", "max", "confirmed"],
    )


@topic.command("alter")
@click.argument("name")
@click.option("--queues", type=click.IntRange(min=1), help="the new queue count per broker set (only up)")
@click.option(
    "--broker-set", "broker_sets", multiple=True, help="only these broker sets (default: all of it)"
)
@click.option(
    "--retention", default=None, metavar="DURATION", callback=retention_option, help=_RETENTION_HELP
)
@controllers_option
@json_option
def topic_alter(
    name: str,
    queues: int | None,
    broker_sets: tuple[str, ...],
    retention: int | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Grow topic NAME to QUEUES queues in each of its broker sets, and/or set its retention.

    Queues only go up (a queue that went away would orphan its messages and committed offsets);
    a broker set the topic does not have yet is added. Messages sent by key may map to another
    queue afterwards. A retention shorter than the brokers' makes its old messages unreadable
    sooner; a longer one keeps the segments holding them (docs/ARCHITECTURE.md §6.4)."""
    if queues is None and retention is None:
        raise click.UsageError("say what to change: --queues N and/or --retention DURATION")
    out: dict[str, object] = {"topic": name}
    with open_client(controllers) as c:
        admin = c.admin()
        if queues is not None:
            out["queues"] = admin.alter_topic_queues(name, queues, broker_sets=broker_sets or None)
        if retention is not None:
            out["retention_ms"] = admin.alter_topic_retention(name, retention)
            out["retention"] = format_retention(retention)
    emit(out, as_json, title=f"topic {name}")


@topic.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="delete even while a consumer group reads it")
@click.option(
    "--in-use-window",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="in use = a group member polled it within this many seconds",
)
@controllers_option
@json_option
def topic_delete(name: str, force: bool, in_use_window: float, controllers: str, as_json: bool) -> None:
    """Delete topic NAME. Its messages are never readable again (also not in a topic created
    later under the same name); their bytes go with retention. Refused while a consumer group
    reads it (a member announced it within --in-use-window), unless --force."""
    with open_client(controllers) as c:
        readers = c.admin().topic_readers(name, int(in_use_window * 1000))
        if readers and not force:
            raise TopicInUseError(
                f"topic {name} is read by consumer group(s) {', '.join(readers)} "
                f"(a member polled it within the last {in_use_window:g} s)",
                topic=name,
                groups=readers,
            )
        c.admin().delete_topic(name)
    emit(
        {"topic": name, "deleted": True, "forced": bool(readers), "readers": readers},
        as_json,
        title="deleted",
    )


@click.command("produce")
@click.argument("topic_name", metavar="TOPIC")
@click.option("--count", type=int, default=None, help="send COUNT generated messages (else: lines of stdin)")
@click.option("--size", type=int, default=100, show_default=True, help="body size of generated messages")
@click.option("--key", default=None, help="key for every message (keeps them in one queue, in order)")
@click.option("--batch", type=int, default=100, show_default=True, help="messages per request")
@click.option(
    "--ids", "print_ids", is_flag=True, help="print each message's id, one a line, instead of the summary"
)
@controllers_option
@json_option
@quiet_option
def produce(
    topic_name: str,
    count: int | None,
    size: int,
    key: str | None,
    batch: int,
    print_ids: bool,
    controllers: str,
    as_json: bool,
) -> None:
    """Send messages to TOPIC: COUNT generated ones, or one per line of standard input. The
    summary names the first and last message id per queue (`tide message get --id` reads one);
    Ctrl-C stops it and says how many were acknowledged."""
    if batch < 1 or size < 0 or (count is not None and count < 0):
        raise click.UsageError("--count, --size and --batch must not be negative (--batch at least 1)")
    check_body_size(topic_name, size)
    sent = Sent(print_ids)
    t0 = time.monotonic()
    interrupted = False
    with open_client(controllers) as c, _stop_on_ctrl_c(count is not None) as stop:
        try:
            _send_all(c.producer(), topic_name, count, size, key, batch, sent, as_json or print_ids, stop)
        except KeyboardInterrupt:
            # what was acknowledged is stored: say how much, rather than a bare "aborted"
            interrupted = True
        interrupted = interrupted or stop.is_set()
    elapsed = time.monotonic() - t0
    if interrupted:
        click.echo(f"interrupted: {sent.count} acknowledged", err=True)
    if not print_ids:
        summary: dict[str, object] = {
            "topic": topic_name,
            "sent": sent.count,
            "seconds": round(elapsed, 3),
            "per_second": round(sent.count / elapsed) if elapsed > 0 else None,
        }
        if as_json:
            emit({**summary, "queues": sent.queues(), "interrupted": interrupted}, True)
        else:
            emit(summary, False, title="produced")
            if sent.count:
                emit(sent.queues(), False, title="message ids", columns=QUEUE_COLUMNS)
    if interrupted:
        sys.exit(130)


@contextlib.contextmanager
def _stop_on_ctrl_c(between_batches: bool) -> Iterator[threading.Event]:
    """While generated messages are sent, Ctrl-C sets the event the send loop checks between
    batches rather than raising wherever the main thread happens to be (inside the client's locks
    or its loop thread's hand-over, a KeyboardInterrupt could leave the close waiting for good);
    a second Ctrl-C interrupts at once. Reading standard input keeps the plain KeyboardInterrupt:
    a read blocked on a terminal must end at the first Ctrl-C."""
    stop = threading.Event()
    if not between_batches:
        yield stop
        return

    def on_sigint(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _send_all(
    p: Producer,
    topic_name: str,
    count: int | None,
    size: int,
    key: str | None,
    batch: int,
    sent: Sent,
    quiet: bool,
    stop: threading.Event,
) -> None:
    """COUNT generated messages (with a progress bar) until `stop` is set, or one per line of
    standard input."""
    if count is not None:
        with progress(f"producing to {topic_name}", count, quiet) as step:
            while sent.count < count and not stop.is_set():
                n = min(batch, count - sent.count)
                # each body starts with its sequence number, so every message is distinct
                pad = os.urandom(size // 2 + 1).hex().encode()
                first = sent.count
                messages = [OutMessage((b"%d " % (first + i) + pad)[:size], key) for i in range(n)]
                sent.add(p.send_batch(topic_name, messages))
                step(n)
        return
    pending: list[OutMessage] = []
    for line in sys.stdin.buffer:
        pending.append(OutMessage(line.rstrip(b"\n"), key))
        if len(pending) >= batch:
            sent.add(p.send_batch(topic_name, pending))
            pending = []
    if pending:
        sent.add(p.send_batch(topic_name, pending))


QUEUE_COLUMNS = ["broker_set", "queue", "messages", "first_offset", "last_offset", "first_id", "last_id"]


class Sent:
    """What a produce had acknowledged: a count, the first and last receipt per queue, and with
    `print_ids` each message id printed as its batch is acknowledged."""

    def __init__(self, print_ids: bool) -> None:
        self.count = 0
        self.print_ids = print_ids
        self._queues: dict[tuple[str, int], tuple[Receipt, Receipt, int]] = {}

    def add(self, receipts: list[Receipt]) -> None:
        self.count += len(receipts)
        for r in receipts:
            first, _, n = self._queues.get((r.broker_set, r.queue), (r, r, 0))
            self._queues[(r.broker_set, r.queue)] = (first, r, n + 1)
        if self.print_ids:
            click.echo("\n".join(r.message_id for r in receipts))

    def queues(self) -> list[dict[str, object]]:
        return [
            {
                "broker_set": first.broker_set,
                "queue": first.queue,
                "messages": n,
                "first_offset": first.queue_offset,
                "last_offset": last.queue_offset,
                "first_id": first.message_id,
                "last_id": last.message_id,
            }
            for (first, last, n) in (self._queues[q] for q in sorted(self._queues))
        ]


@click.command("consume")
@click.argument("topic_name", metavar="TOPIC")
@click.option("--group", required=True, help="consumer group")
@click.option(
    "--mode",
    type=click.Choice(["clustering", "broadcast", "exclusive", "failover", "shared", "key_shared"]),
    default="clustering",
    show_default=True,
    help="subscription mode: share the queues, read all with own offsets, one member only, "
    "one active member with standbys, or any member any message (each acknowledged once printed)",
)
@click.option("--member-id", default=None, help="this member's id (broadcast: keeps its offsets across runs)")
@click.option(
    "--from-beginning", is_flag=True, help="with no committed offset, start at the earliest message"
)
@click.option(
    "--max-messages", type=click.IntRange(min=1), default=None, help="stop after this many messages"
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="stop after this many seconds without a message (0 = never)",
)
@controllers_option
@json_option
@quiet_option
def consume(
    topic_name: str,
    group: str,
    mode: str,
    member_id: str | None,
    from_beginning: bool,
    max_messages: int | None,
    idle_timeout: float,
    controllers: str,
    as_json: bool,
) -> None:
    """Read TOPIC as a member of GROUP, printing one line per message; offsets are committed.
    It stops after --idle-timeout seconds without a message (5 by default; 0: never), after
    --max-messages, or at Ctrl-C."""
    got = 0
    last = time.monotonic()
    start = "earliest" if from_beginning else "latest"
    # with a count, a bar on the terminal's standard error; not while the messages themselves are
    # printed on that terminal (they are the progress there, and a bar would tear them)
    bar = max_messages is not None and not sys.stdout.isatty()
    with (
        open_client(controllers) as c,
        c.consumer(group=group, topic=topic_name, start=start, mode=mode, member_id=member_id) as cons,
        progress(f"consuming {topic_name}", max_messages, as_json or not bar) as step,
        contextlib.suppress(KeyboardInterrupt),
    ):
        while max_messages is None or got < max_messages:
            msgs = cons.poll(max_messages=poll_size(max_messages, got), timeout=0.5)
            step(len(msgs))
            for m in msgs:
                if as_json:
                    click.echo(
                        json.dumps(
                            {
                                "topic": m.topic,
                                "broker_set": m.broker_set,
                                "queue": m.queue,
                                "offset": m.offset,
                                "key": m.key,
                                "body": m.body.decode("utf-8", "replace"),
                            }
                        )
                    )
                else:
                    click.echo(
                        f"{m.broker_set}/{m.queue}@{m.offset} {m.key or '-'} "
                        f"{m.body.decode('utf-8', 'replace')}"
                    )
            if msgs and mode in ("shared", "key_shared"):
                cons.ack_all(msgs)  # each message once printed: none comes back
            got += len(msgs)
            if msgs:
                last = time.monotonic()
            elif idle_timeout and time.monotonic() - last > idle_timeout:
                break
        cons.commit()


def check_body_size(topic_name: str, size: int) -> None:
    """Refuse a generated body no request could carry before building it (a 10 GB body was built
    first, for a minute of CPU, only to be refused by the client's cut into requests)."""
    room = produce_room(topic_name) - rec.HEADER_SIZE - len(topic_name.encode())
    if size > room:
        raise MessageTooLargeError(
            f"a message of {size} bytes is over max_message_bytes (never more than {room}: what one "
            "request carries)"
        )


def poll_size(max_messages: int | None, got: int) -> int:
    """How many messages the next poll asks for: up to 500, never more than are still wanted
    (with no limit, always 500: a size that shrank with what was read polled one at a time)."""
    return 500 if max_messages is None else max(1, min(500, max_messages - got))
