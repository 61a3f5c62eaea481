"""Options and output helpers shared by the client-facing commands."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tidelog.client.controllers import CONTROLLERS_ENV, QUORUM_TIMEOUT_S, ControllerClient, parse_addresses
from tidelog.clusterauth import find_secret
from tidelog.errors import ConfigError, InvalidArgumentError, TidelogError
from tidelog.proto import controller_pb2 as pb

if TYPE_CHECKING:
    from rich.console import Console

    from tidelog.client import Client

# rich's tables and progress bars, and the data client, are imported where a command first uses
# them: every `tide` call, and every broker and controller (which start through this package),
# imports this module, and those imports were a third of a `tide` call's CPU (the suite runs
# `tide` several hundred times).

F = Callable[..., Any]
T = TypeVar("T")

#: How long a command keeps trying the controllers before it gives up with UNAVAILABLE.
CONTROLLER_TIMEOUT_ENV = "TIDE_CONTROLLER_TIMEOUT"
DEFAULT_CONTROLLER_TIMEOUT = 15.0


def log_options(fn: F) -> F:
    """`--log-level` and `--log-format`, the same on every long-running process (broker, controller)."""
    fn = click.option(
        "--log-format",
        default=None,
        type=click.Choice(["text", "json"]),
        help="text lines, or one JSON object per line (default: the config's log_format, else text)",
    )(fn)
    return click.option(
        "--log-level",
        default="INFO",
        show_default=True,
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    )(fn)


def controllers_option(fn: F) -> F:
    return click.option(
        "--controllers",
        default=lambda: os.environ.get(CONTROLLERS_ENV, ""),
        show_default=f"${CONTROLLERS_ENV}",
        help="controller addresses host:port[,host:port...]",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print one JSON document")(fn)


def secret_options(fn: F) -> F:
    """--secret-file and --data-dir: where a signed (membership) call finds the cluster secret."""
    fn = click.option(
        "--secret-file", default=None, type=click.Path(dir_okay=False), help="file holding the cluster secret"
    )(fn)
    return click.option(
        "--data-dir",
        default=lambda: os.environ.get("TIDE_DATA_DIR", "tide-data"),
        show_default="$TIDE_DATA_DIR or ./tide-data",
        help="a cluster started by `tide cluster up`: its controller.yaml holds the secret",
    )(fn)


def controller_call(
    controllers: str,
    fn: Callable[[ControllerClient], Awaitable[T]],
    *,
    timeout: float | None = None,
    secret_file: str | None = None,
    data_dir: str | None = None,
) -> T:
    """Run one coroutine against the controller cluster, signing membership calls with the
    cluster secret found by `find_secret` (a file, the environment, or a cluster's data dir).
    It keeps trying for `timeout` seconds (default: `controller_timeout()`)."""

    async def go() -> T:
        secret = find_secret(secret_file, data_dir)
        async with ControllerClient(controllers, secret=secret) as client:
            for_command(client)
            if timeout is not None:
                client.total_timeout = timeout
            return await fn(client)

    return asyncio.run(go())


async def describe_with_liveness(
    client: ControllerClient, names: Sequence[str]
) -> pb.DescribeBrokerSetsReply:
    """Describe broker sets, from the leader when one answers: only the leader knows which
    brokers are alive, and a read may be answered by any node."""
    reply = await client.describe_broker_sets(names)
    if reply.liveness_known:
        return reply
    request = pb.DescribeBrokerSetsRequest(names=list(names))
    for address in client.addresses:
        with contextlib.suppress(TidelogError):
            # the leader may not be among the addresses given: each node names it
            leader = (await client.cluster_status(address=address)).leader_address
            if leader:
                answer = await client.call("route", "DescribeBrokerSets", request, address=leader)
                if answer.liveness_known:
                    return answer
    return reply


def controller_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a command keeps trying the controllers: $TIDE_CONTROLLER_TIMEOUT, else 15 (a
    script that would rather fail fast, or wait out a long controller election, sets it)."""
    raw = environ.get(CONTROLLER_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CONTROLLER_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"${CONTROLLER_TIMEOUT_ENV} must be a positive number of seconds, not {raw!r}")
    return seconds


def for_command(client: ControllerClient) -> ControllerClient:
    """A command's controller client: it tries for `controller_timeout()` seconds and says on a
    terminal what it is still trying (`tell_waits`)."""
    client.total_timeout = controller_timeout()
    # what needs an absent controller quorum fails within seconds (CONTROLLER_UNAVAILABLE)
    client.quorum_timeout = min(QUORUM_TIMEOUT_S, client.total_timeout)
    return tell_waits(client)


def tell_waits(client: ControllerClient) -> ControllerClient:
    """Say on a terminal's standard error what is still being tried when no controller answers
    at once (like progress: a pipe or a log gets only the final one-line error)."""
    if progress_shown(as_json=False):
        client.on_wait = lambda msg: click.echo(f"waiting: {msg}", err=True)
    return client


def open_client(controllers: str) -> Client:
    """The client of a command, which says what it is trying while no controller answers."""
    from tidelog.client import Client

    client = Client(require_controllers(controllers))
    for_command(client.aio.controller)
    return client


def require_controllers(controllers: str) -> str:
    """The --controllers value, refused at once when it is empty, malformed, or names only hosts
    that DNS says do not exist: a command would otherwise retry them for its whole timeout. A
    long-running client (the library) keeps retrying instead, as a name may appear later."""
    if not controllers.strip():
        raise click.UsageError(f"no controller address: pass --controllers or set ${CONTROLLERS_ENV}")
    addresses = parse_addresses(controllers)
    unknown = [a for a in addresses if _unknown_host(a)]
    if unknown and len(unknown) == len(addresses):
        hosts = ", ".join(sorted({a.rpartition(":")[0] for a in unknown}))
        raise InvalidArgumentError(
            f"no controller host resolves: DNS does not know {hosts}",
            hint=f"check the names in --controllers or ${CONTROLLERS_ENV} (`tide cluster up` prints them)",
        )
    return controllers


def _unknown_host(address: str) -> bool:
    """Whether DNS answered that `address`'s host does not exist (a temporary failure is not)."""
    host = address.rpartition(":")[0].strip("[]")
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        return exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
    return False


#: The width of tables written to a pipe or a file: wide enough that no cell is folded or cut
#: (rich would otherwise assume 80 columns); a terminal's own width is used as it is.
PIPE_WIDTH = 1000


def console() -> Console:
    """Where tables go: the terminal at its width, or a pipe or file without folding at 80
    columns (an explicit $COLUMNS still wins)."""
    from rich.console import Console

    out = Console()
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out = Console(width=PIPE_WIDTH)
    return out


def emit(rows: Any, as_json: bool, *, title: str = "", columns: Sequence[str] | None = None) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True, default=str))
        return
    if isinstance(rows, dict):
        rows = [{"what": k, "value": cell(k, v)} for k, v in rows.items()]
    from rich.table import Table

    table = Table(title=title or None)
    cols = list(columns or (rows[0].keys() if rows else []))
    for c in cols:
        table.add_column(c.replace("_", " "))
    for r in rows:
        table.add_row(*(cell(c, r.get(c)) for c in cols))
    console().print(table)


def cell(column: str, value: Any) -> str:
    """A value as a table shows it (--json keeps the raw one): a mapping as "k: v, ...", a list
    joined by commas, nothing as "-", a yes or no, and a time in milliseconds (a column named
    `*_ts`) in ISO 8601, UTC — not Python's repr of each."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {cell('', v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return ", ".join(cell("", v) for v in items) or "-"
    if column.endswith("_ts") and isinstance(value, int) and value > 0:
        return iso_ms(value)
    return str(value)


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 in UTC, to the millisecond: 2026-11-28T08:07:23.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


#: Set (by `--quiet`, or in the environment) to draw no progress bar and no "waiting" lines.
QUIET_ENV = "TIDE_QUIET"


def progress_shown(as_json: bool) -> bool:
    """Progress goes to a terminal only: never into --json output, a pipe or a log file, nor
    with --quiet (`tide --quiet ...`, a command's own --quiet, or $TIDE_QUIET)."""
    return not as_json and not os.environ.get(QUIET_ENV) and sys.stderr.isatty()


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        # every progress bar and wait line of this process asks progress_shown
        os.environ[QUIET_ENV] = "1"


def quiet_option(fn: F) -> F:
    """`--quiet`: no progress bar on the terminal (a pipe never gets one anyway)."""
    return click.option(
        "--quiet",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_quiet,
        help=f"draw no progress bar (same as ${QUIET_ENV}=1)",
    )(fn)


@contextlib.contextmanager
def progress(description: str, total: float | None, as_json: bool) -> Iterator[Callable[..., None]]:
    """A progress bar on standard error, gone once the work is done; yields
    `step(advance=1, description=None)`. Nothing is drawn unless `progress_shown`."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not progress_shown(as_json),
    )
    with bar:
        task = bar.add_task(description, total=total)

        def step(advance: float = 1, description: str | None = None) -> None:
            bar.update(task, advance=advance, description=description)

        yield step
