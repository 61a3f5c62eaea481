"""Options and output helpers shared by the client-facing commands."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tidelog.controller.client import CONTROLLERS_ENV

F = Callable[..., Any]


def controllers_option(fn: F) -> F:
    return click.option("--controllers", default=lambda: os.environ.get(CONTROLLERS_ENV, ""),
                        show_default=f"${CONTROLLERS_ENV}",
                        help="controller addresses host:port[,host:port...]")(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print one JSON document")(fn)


def require_controllers(controllers: str) -> str:
    if not controllers.strip():
        raise click.UsageError(f"no controller address: pass --controllers or set ${CONTROLLERS_ENV}")
    return controllers


def emit(rows: Any, as_json: bool, *, title: str = "", columns: Sequence[str] | None = None) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True, default=str))
        return
    if isinstance(rows, dict):
        rows = [{"what": k, "value": v} for k, v in rows.items()]
    table = Table(title=title or None)
    cols = list(columns or (rows[0].keys() if rows else []))
    for c in cols:
        table.add_column(c.replace("_", " "))
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in cols))
    Console().print(table)
