"""`tide ledger ...`: create, write, read, tail, recover, inspect and delete ledgers, thin over
`tidelog.ledger` (the ledger client API and `SegmentedLog`).

A ledger has exactly one writer, the handle that created it, so `append` creates a ledger,
writes its entries and closes it (with `--keep-open` it stays OPEN, as if its writer had died:
`recover` then seals it). `append`, `read`, `tail` and `info` also work on a segmented log
(`--log NAME`): append acquires the log (fencing its previous owner), appends, and releases it.

Every command prints a readable table, or one JSON document with `--json` (`tail --json`: one
JSON object per line). Entry data is shown as UTF-8 text (undecodable bytes replaced) and, in
JSON, exactly as `data_base64`. Bad input is a typed error (IncorrectParameterError) before
anything is sent; errors exit 1 with their code, message and hint (see `tidelog.cli.main`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import Iterable
from typing import Any

import click

from tidelog.cli.common import controllers_option, emit, json_option, require_controllers
from tidelog.client import Client
from tidelog.errors import IncorrectParameterError, NoSuchLedgerExistsError
from tidelog.invariants import present
from tidelog.ledger.metadata import LedgerMetadata, LedgerState
from tidelog.ledger.seglog_record import START, Position, check_position
from tidelog.ledger.seglog_rolling import default_ensemble_size
from tidelog.ledger.sync import Ledgers, ReadHandle, SegmentedLog

PASSWORD_ENV = "TIDE_LEDGER_PASSWORD"
DIGESTS = ("crc32c", "crc32", "mac", "dummy")


# --- input --------------------------------------------------------------------------------


def parse_ledger_id(text: str) -> int:
    """A ledger id as typed on the command line: decimal digits only."""
    if not text.isascii() or not text.isdigit():
        raise IncorrectParameterError(f"a ledger id is a non-negative decimal integer, got {text!r}")
    return int(text)


def parse_custom(items: Iterable[str]) -> dict[str, bytes]:
    """KEY=VALUE pairs → custom metadata (values as UTF-8 bytes); a key may appear once."""
    out: dict[str, bytes] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise IncorrectParameterError(f"custom metadata is KEY=VALUE, got {item!r}")
        if key in out:
            raise IncorrectParameterError(f"custom metadata key {key!r} given twice")
        out[key] = value.encode("utf-8")
    return out


def check_range(first: int | None, last: int | None) -> None:
    for name, value in (("--from", first), ("--to", last)):
        if value is not None and value < 0:
            raise IncorrectParameterError(f"{name} is an entry id (≥ 0), got {value}")
    if first is not None and last is not None and last < first:
        raise IncorrectParameterError(f"--to ({last}) is before --from ({first})")


def parse_position(text: str | None) -> Position:
    if text is None:
        return START
    return check_position(Position.parse(text))


def password_bytes(password: str | None) -> bytes:
    if password is None:
        raise click.UsageError(
            f"the ledger password is needed: pass --password or set ${PASSWORD_ENV} "
            f"(--password '' for an empty one)"
        )
    return password.encode("utf-8")


def read_inputs(data: tuple[str, ...]) -> list[bytes]:
    """The entries to write: each --data, or else each line of standard input (newline removed)."""
    if data:
        return [d.encode("utf-8") for d in data]
    return [line.rstrip(b"\n") for line in sys.stdin.buffer]


# --- output -------------------------------------------------------------------------------


def entry_doc(data: bytes, **where: Any) -> dict[str, Any]:
    """One entry for output: where it is (entry_id, or position in a log) and its data. A
    ledger's entry comes with `length`, its own size, and `ledger_length`, BookKeeper's
    cumulative length of the ledger through it (the column once showed that as `length`)."""
    return {
        **where,
        "data": data.decode("utf-8", "replace"),
        "data_base64": base64.b64encode(data).decode("ascii"),
    }


def metadata_doc(meta: LedgerMetadata) -> dict[str, Any]:
    return {
        "ledger_id": meta.ledger_id,
        "state": str(meta.state),
        "broker_set": meta.broker_set,
        "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum,
        "ensembles": {str(first): list(members) for first, members in meta.ensembles},
        "digest_type": str(meta.digest_type),
        "last_entry_id": meta.last_entry_id,
        "length": meta.length,
        "ctime_ms": meta.ctime_ms,
        "custom_metadata": {k: v.decode("utf-8", "replace") for k, v in meta.custom_metadata},
    }


def _metadata_rows(meta: LedgerMetadata) -> dict[str, Any]:
    doc = metadata_doc(meta)
    doc["ensembles"] = "; ".join(f"from {k}: {v}" for k, v in doc["ensembles"].items())
    doc["custom_metadata"] = ", ".join(f"{k}={v}" for k, v in doc["custom_metadata"].items()) or None
    doc["created"] = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.ctime_ms / 1000))
        if meta.ctime_ms >= 0
        else None
    )
    return doc


def _entries_table(
    rows: list[dict[str, Any]], as_json: bool, doc: dict[str, Any], title: str, columns: list[str]
) -> None:
    if as_json:
        emit({**doc, "entries": rows}, True)
    else:
        emit(rows, False, title=title, columns=columns)


# --- options ------------------------------------------------------------------------------


def password_option(fn: Any) -> Any:
    return click.option(
        "--password",
        envvar=PASSWORD_ENV,
        default=None,
        show_envvar=True,
        help=f"ledger password (UTF-8); default ${PASSWORD_ENV}",
    )(fn)


def create_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--ensemble-size",
                "-e",
                type=int,
                default=None,
                help="E = WQ: the replica count of the broker set (default: what the broker sets have)",
            ),
            click.option(
                "--write-quorum", "-w", type=int, default=None, help="WQ (default: E; must equal E)"
            ),
            click.option("--ack-quorum", "-a", type=int, default=None, help="AQ ≤ WQ (default: WQ)"),
            click.option(
                "--digest",
                type=click.Choice(DIGESTS, case_sensitive=False),
                default="crc32c",
                show_default=True,
                help="per-entry digest",
            ),
            click.option(
                "--meta", "custom", multiple=True, metavar="KEY=VALUE", help="custom metadata (repeatable)"
            ),
            click.option("--broker-set", default=None, help="place the ledger in this broker set"),
        ]
    ):
        fn = option(fn)
    return fn


def _quorums(
    client: Client, ensemble_size: int | None, write_quorum: int | None, ack_quorum: int | None
) -> tuple[int, int, int]:
    if ensemble_size is None:
        ensemble_size = client.runner.run(default_ensemble_size(client.aio))
    wq = ensemble_size if write_quorum is None else write_quorum
    return ensemble_size, wq, wq if ack_quorum is None else ack_quorum


# --- commands -----------------------------------------------------------------------------


@click.group("ledger")
def ledger() -> None:
    """Ledgers with BookKeeper's semantics, and segmented logs made of them."""


@ledger.command("create")
@create_options
@click.option("--close", "close_it", is_flag=True, help="close the empty ledger at once")
@password_option
@controllers_option
@json_option
def create(
    ensemble_size: int | None,
    write_quorum: int | None,
    ack_quorum: int | None,
    digest: str,
    custom: tuple[str, ...],
    broker_set: str | None,
    close_it: bool,
    password: str | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Create an empty ledger and print its metadata.

    Only the creating handle may add to a ledger, and it ends with this command: the ledger stays
    OPEN (seal it with `tide ledger recover`) unless --close. To write entries use `append`.
    """
    pw, meta = password_bytes(password), parse_custom(custom)
    with Client(require_controllers(controllers)) as c:
        e, wq, aq = _quorums(c, ensemble_size, write_quorum, ack_quorum)
        handle = Ledgers(c).create_ledger(
            e, wq, aq, pw, digest=digest, custom_metadata=meta, broker_set=broker_set
        )
        if close_it:
            handle.close()
        info = Ledgers(c).get_metadata(handle.ledger_id)
    emit(metadata_doc(info) if as_json else _metadata_rows(info), as_json, title=f"ledger {info.ledger_id}")


@ledger.command("append")
@click.option("--data", "-d", multiple=True, help="an entry (repeatable); without it, each line of stdin")
@click.option("--log", "log_name", default=None, help="append to segmented log NAME instead of a new ledger")
@click.option("--keep-open", is_flag=True, help="leave the new ledger OPEN, as if its writer had died")
@create_options
@password_option
@controllers_option
@json_option
def append(
    data: tuple[str, ...],
    log_name: str | None,
    keep_open: bool,
    ensemble_size: int | None,
    write_quorum: int | None,
    ack_quorum: int | None,
    digest: str,
    custom: tuple[str, ...],
    broker_set: str | None,
    password: str | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Write entries (each --data, or each line of stdin) to a new ledger, then close it.

    With --log NAME: acquire segmented log NAME (fencing its previous owner), append, release.
    """
    pw, meta = password_bytes(password), parse_custom(custom)
    if log_name is not None and (keep_open or custom):
        raise click.UsageError("--keep-open and --meta apply to a new ledger, not to --log")
    entries = read_inputs(data)
    t0 = time.monotonic()
    with Client(require_controllers(controllers)) as c:
        e, wq, aq = _quorums(c, ensemble_size, write_quorum, ack_quorum)
        if log_name is not None:
            if wq != e:
                raise IncorrectParameterError(
                    f"tidelog requires write_quorum == ensemble_size, got {wq} and {e}"
                )
            with SegmentedLog(
                c, log_name, password=pw, ensemble_size=e, ack_quorum=aq, digest=digest, broker_set=broker_set
            ) as log:
                rec = log.acquire()
                positions = [log.append(d) for d in entries]
            elapsed = time.monotonic() - t0
            shown: Any = [str(p) for p in positions]
            emit(
                {
                    "log": log_name,
                    "generation": rec.generation,
                    "appended": len(positions),
                    "positions": shown if as_json else " ".join(shown),
                    "seconds": round(elapsed, 3),
                },
                as_json,
                title=f"appended to log {log_name}",
            )
            return
        handle = Ledgers(c).create_ledger(
            e, wq, aq, pw, digest=digest, custom_metadata=meta, broker_set=broker_set
        )
        futures = [handle.add_entry_async(d) for d in entries]  # pipelined; they complete in order
        ids = [f.result() for f in futures]
        if not keep_open:
            handle.close()
        doc = {
            "ledger_id": handle.ledger_id,
            "entry_ids": ids,
            "last_add_confirmed": handle.last_add_confirmed,
            "length": handle.length,
            "state": "OPEN" if keep_open else "CLOSED",
            "seconds": round(time.monotonic() - t0, 3),
        }
    if not as_json:
        doc["entry_ids"] = f"{ids[0]}..{ids[-1]}" if ids else "none"
    emit(doc, as_json, title=f"ledger {doc['ledger_id']}")


@ledger.command("read")
@click.argument("ledger_id", required=False)
@click.option("--from", "first", type=int, default=None, help="first entry id (default 0)")
@click.option("--to", "last", type=int, default=None, help="last entry id (default: the LAC)")
@click.option("--log", "log_name", default=None, help="read segmented log NAME")
@click.option(
    "--from-position",
    "from_position",
    default=None,
    metavar="LEDGER:ENTRY",
    help="with --log: where to start (default: the beginning)",
)
@click.option(
    "--max-entries",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="with --log: at most this many entries",
)
@click.option(
    "--unconfirmed", is_flag=True, help="read past the LAC (entries whose outcome may be undecided)"
)
@password_option
@controllers_option
@json_option
def read(
    ledger_id: str | None,
    first: int | None,
    last: int | None,
    log_name: str | None,
    from_position: str | None,
    max_entries: int,
    unconfirmed: bool,
    password: str | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Print entries FROM..TO of LEDGER_ID (by default all confirmed ones), or of a segmented log."""
    pw = password_bytes(password)
    check_range(first, last)
    if log_name is not None:
        if ledger_id is not None or first is not None or last is not None or unconfirmed:
            raise click.UsageError(
                "with --log, give --from-position and --max-entries, not a ledger id or --from/--to"
            )
        start = parse_position(from_position)
        with Client(require_controllers(controllers)) as c, SegmentedLog(c, log_name, password=pw) as log:
            got, nxt = log.read_from(start, max_entries)
        rows = [entry_doc(e.data, position=str(e.position)) for e in got]
        _entries_table(
            rows,
            as_json,
            {"log": log_name, "next_position": str(nxt)},
            f"log {log_name}",
            ["position", "data"],
        )
        return
    if ledger_id is None:
        raise click.UsageError("give a LEDGER_ID, or --log NAME")
    if from_position is not None:
        raise click.UsageError("--from-position is for --log; use --from/--to with a ledger id")
    lid = parse_ledger_id(ledger_id)
    with Client(require_controllers(controllers)) as c:
        handle = Ledgers(c).open_ledger(lid, pw, recovery=False)
        lac = handle.last_add_confirmed
        lo = 0 if first is None else first
        hi = lac if last is None else last
        got = []
        if hi >= lo:
            reader = handle.read_unconfirmed_entries if unconfirmed else handle.read_entries
            got = reader(lo, hi)
        handle.close()
    rows = [entry_doc(e.data, entry_id=e.entry_id, length=len(e.data), ledger_length=e.length) for e in got]
    _entries_table(
        rows,
        as_json,
        {"ledger_id": lid, "last_add_confirmed": lac},
        f"ledger {lid} (LAC {lac})",
        ["entry_id", "length", "data"],
    )


def _print_entry(as_json: bool, doc: dict[str, Any], label: str) -> None:
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        click.echo(f"{label} {doc['data']}")


@ledger.command("tail")
@click.argument("ledger_id", required=False)
@click.option("--from", "first", type=int, default=0, show_default=True, help="first entry id")
@click.option("--log", "log_name", default=None, help="follow segmented log NAME")
@click.option("--max-entries", type=click.IntRange(min=1), default=None, help="stop after this many entries")
@click.option(
    "--idle-timeout",
    type=float,
    default=0.0,
    show_default=True,
    help="stop after this many seconds without a new entry (0 = never)",
)
@password_option
@controllers_option
@json_option
def tail(
    ledger_id: str | None,
    first: int,
    log_name: str | None,
    max_entries: int | None,
    idle_timeout: float,
    password: str | None,
    controllers: str,
    as_json: bool,
) -> None:
    """Print entries of LEDGER_ID as they are confirmed (long-polling the LAC); stops once the
    ledger is closed and read to its end. One line per entry (JSON with --json)."""
    pw = password_bytes(password)
    check_range(first, None)
    if idle_timeout < 0:
        raise IncorrectParameterError(f"--idle-timeout is ≥ 0, got {idle_timeout}")
    progress = _TailProgress(max_entries, idle_timeout, as_json)
    with Client(require_controllers(controllers)) as c, contextlib.suppress(KeyboardInterrupt):
        if log_name is not None:
            if ledger_id is not None:
                raise click.UsageError("give a LEDGER_ID or --log NAME, not both")
            _tail_log(SegmentedLog(c, log_name, password=pw), progress)
            return
        if ledger_id is None:
            raise click.UsageError("give a LEDGER_ID, or --log NAME")
        lid = parse_ledger_id(ledger_id)
        ledgers = Ledgers(c)
        _tail_ledger(ledgers, ledgers.open_ledger(lid, pw, recovery=False), first, progress)


class _TailProgress:
    """What `tail` printed so far and when it last saw a new entry, against its stop conditions."""

    def __init__(self, max_entries: int | None, idle_timeout: float, as_json: bool) -> None:
        self.max_entries = max_entries
        self.idle_timeout = idle_timeout
        self.as_json = as_json
        self.got = 0
        self.last_new = time.monotonic()

    def idle(self) -> bool:
        return bool(self.idle_timeout) and time.monotonic() - self.last_new > self.idle_timeout

    def done(self) -> bool:
        return self.max_entries is not None and self.got >= self.max_entries

    def room(self, default: int) -> int:
        """How many more entries to read at most (`default` when --max-entries is not given)."""
        return default if self.max_entries is None else self.max_entries - self.got

    def last_to_read(self, nxt: int, lac: int) -> int:
        """The last entry id to read from `nxt` when the LAC is `lac`, within --max-entries."""
        return lac if self.max_entries is None else min(lac, nxt + self.max_entries - self.got - 1)

    def wait_s(self) -> float:
        """How long one long poll may wait: up to 1 s, never past the idle timeout."""
        if not self.idle_timeout:
            return 1.0
        return max(0.05, min(1.0, self.idle_timeout - (time.monotonic() - self.last_new)))

    def show(self, doc: dict[str, Any], label: str) -> None:
        _print_entry(self.as_json, doc, label)
        self.got += 1


def _tail_log(log: SegmentedLog, progress: _TailProgress) -> None:
    position = START
    with log:
        while not progress.done() and not progress.idle():
            batch, position = log.read_from(position, progress.room(100))
            for e in batch:
                progress.show(entry_doc(e.data, position=str(e.position)), str(e.position))
            if batch:
                progress.last_new = time.monotonic()
            else:
                time.sleep(0.2)


def _tail_ledger(ledgers: Ledgers, handle: ReadHandle, first: int, progress: _TailProgress) -> None:
    nxt = first
    lac = handle.last_add_confirmed
    while not progress.done():
        if nxt <= lac:
            hi = progress.last_to_read(nxt, lac)
            for e in handle.read_entries(nxt, hi):
                progress.show(
                    entry_doc(e.data, entry_id=e.entry_id, length=len(e.data), ledger_length=e.length),
                    str(e.entry_id),
                )
                nxt = e.entry_id + 1
            progress.last_new = time.monotonic()
            continue
        meta = ledgers.get_metadata(handle.ledger_id)
        if (meta.state is LedgerState.CLOSED and nxt > meta.last_entry_id) or progress.idle():
            break
        lac = max(lac, handle.wait_for_lac(lac, progress.wait_s()))
    handle.close()


@ledger.command("recover")
@click.argument("ledger_id")
@password_option
@controllers_option
@json_option
def recover(ledger_id: str, password: str | None, controllers: str, as_json: bool) -> None:
    """Recovery-open LEDGER_ID: fence its writer, close it where its acknowledged entries end
    (a CLOSED ledger is left as it is), and print that end."""
    pw = password_bytes(password)
    lid = parse_ledger_id(ledger_id)
    t0 = time.monotonic()
    with Client(require_controllers(controllers)) as c:
        handle = Ledgers(c).open_ledger(lid, pw, recovery=True)
        meta = handle.metadata
        handle.close()
    emit(
        {
            "ledger_id": lid,
            "state": str(meta.state),
            "last_entry_id": meta.last_entry_id,
            "length": meta.length,
            "seconds": round(time.monotonic() - t0, 3),
        },
        as_json,
        title=f"ledger {lid} recovered",
    )


@ledger.command("info")
@click.argument("ledger_id", required=False)
@click.option("--log", "log_name", default=None, help="show segmented log NAME's record instead")
@controllers_option
@json_option
def info(ledger_id: str | None, log_name: str | None, controllers: str, as_json: bool) -> None:
    """Print the metadata of LEDGER_ID (or the record of a segmented log)."""
    if (ledger_id is None) == (log_name is None):
        raise click.UsageError("give a LEDGER_ID or --log NAME")
    with Client(require_controllers(controllers)) as c:
        if log_name is not None:
            rec = SegmentedLog(c, log_name).record()
            doc = {
                "log": rec.name,
                "ledgers": list(rec.ledgers),
                "owner": rec.owner,
                "generation": rec.generation,
                "version": rec.version,
            }
            if not as_json:
                doc["ledgers"] = " ".join(map(str, rec.ledgers))
            emit(doc, as_json, title=f"log {log_name}")
            return
        meta = Ledgers(c).get_metadata(
            parse_ledger_id(present(ledger_id, "neither a ledger id nor a log name"))
        )
    emit(metadata_doc(meta) if as_json else _metadata_rows(meta), as_json, title=f"ledger {meta.ledger_id}")


@ledger.command("list")
@controllers_option
@json_option
def list_(controllers: str, as_json: bool) -> None:
    """List every ledger with its state and where it ends."""
    rows = []
    with Client(require_controllers(controllers)) as c:
        ledgers = Ledgers(c)
        for lid in ledgers.list_ledgers():
            try:
                meta = ledgers.get_metadata(lid)
            except NoSuchLedgerExistsError:
                continue  # deleted between the list and the read
            d = metadata_doc(meta)
            rows.append(
                {
                    k: d[k]
                    for k in (
                        "ledger_id",
                        "state",
                        "broker_set",
                        "ensemble_size",
                        "write_quorum",
                        "ack_quorum",
                        "last_entry_id",
                        "length",
                        "digest_type",
                    )
                }
            )
    emit(
        rows,
        as_json,
        title="ledgers",
        columns=[
            "ledger_id",
            "state",
            "broker_set",
            "ensemble_size",
            "write_quorum",
            "ack_quorum",
            "last_entry_id",
            "length",
        ],
    )


@ledger.command("delete")
@click.argument("ledger_id")
@password_option
@controllers_option
@json_option
def delete(ledger_id: str, password: str | None, controllers: str, as_json: bool) -> None:
    """Delete LEDGER_ID's metadata: nobody can open it any more (its entries go with retention).
    The controller takes the delete only with the ledger's password."""
    pw = password_bytes(password)
    lid = parse_ledger_id(ledger_id)
    with Client(require_controllers(controllers)) as c:
        Ledgers(c).delete_ledger(lid, pw)
    emit({"ledger_id": lid, "deleted": True}, as_json, title="deleted")
