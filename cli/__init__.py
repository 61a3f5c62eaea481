"""The `tide` command line: one click group, with each area's commands in its own module."""

from __future__ import annotations

import importlib
import os
import sys

import click

from tidelog import logs
from tidelog.cli.common import quiet_option
from tidelog.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV
from tidelog.errors import TidelogError
from tidelog.tlsconfig import CA_FILE_ENV

#: The format of the command line's own log lines (warnings of the client library): text or json.
LOG_FORMAT_ENV = "TIDE_LOG_FORMAT"


#: Each command of `tide`: its name, and the module and attribute that define it. A command's
#: module is imported only when that command runs (or `tide --help` lists them all): importing
#: every area's module cost each `tide` call about a third of a second more (the broker's and the
#: network lab's modules are the heaviest), and the test suite runs `tide` hundreds of times.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "demo"),
    "controller": ("controller", "controller"),
    "admin": ("admin", "admin"),
    "broker": ("broker", "broker"),
    "cluster": ("cluster", "cluster"),
    "drill": ("cluster", "drill"),
    "fault": ("fault", "fault"),
    "topic": ("data", "topic"),
    "produce": ("data", "produce"),
    "consume": ("data", "consume"),
    "group": ("groups", "group"),
    "message": ("message", "message"),
    "ledger": ("ledger", "ledger"),
    "placement": ("placement", "placement"),
    "top": ("top", "top"),
    "health": ("health", "health"),
    "user": ("users", "user"),
    "acl": ("users", "acl"),
}


def load_command(name: str) -> click.Command:
    """The command `name` of `tide`, its module imported."""
    module, attr = COMMANDS[name]
    command: click.Command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    return command


class LazyGroup(click.Group):
    """A click group whose commands are imported when used (`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        return load_command(cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(package_name="tidelog")
@quiet_option
@click.option(
    "--ca-file",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help=f"connect with TLS, verifying servers against this CA (same as ${CA_FILE_ENV})",
)
@click.option(
    "--access-key",
    default=None,
    help=f"sign calls as the user of this access key (same as ${ACCESS_KEY_ENV})",
)
@click.option(
    "--secret-key", default=None, help=f"the secret key of --access-key (same as ${SECRET_KEY_ENV})"
)
def cli(ca_file: str | None, access_key: str | None, secret_key: str | None) -> None:
    """tidelog: a replicated, durable message log."""
    # every client this command opens reads the environment (tidelog/tlsconfig.py,
    # tidelog/credentials.py), so the options and the variables cannot disagree
    if ca_file:
        os.environ[CA_FILE_ENV] = ca_file
    if access_key:
        os.environ[ACCESS_KEY_ENV] = access_key
    if secret_key:
        os.environ[SECRET_KEY_ENV] = secret_key


def main() -> None:
    """Console entry point: typed errors become one clear line and a non-zero exit."""
    try:
        if os.environ.get(LOG_FORMAT_ENV):
            logs.configure(os.environ[LOG_FORMAT_ENV], "WARNING")
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TidelogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except (OSError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
