"""The `tide` command line: one click group, with each area's commands in its own module."""

from __future__ import annotations

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


@click.group()
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


def _register_commands() -> None:
    from tidelog.cli import (
        admin,
        broker,
        brokerops,
        cluster,
        controller,
        data,
        demo,
        fault,
        groups,
        health,
        ledger,
        message,
        placement,
        top,
        users,
    )

    cli.add_command(demo.demo)
    cli.add_command(controller.controller)
    cli.add_command(admin.admin)
    brokerops.register(broker.broker)
    cli.add_command(broker.broker)
    cli.add_command(cluster.cluster)
    cli.add_command(cluster.drill)
    cli.add_command(fault.fault)
    cli.add_command(data.topic)
    cli.add_command(data.produce)
    cli.add_command(data.consume)
    cli.add_command(groups.group)
    cli.add_command(message.message)
    cli.add_command(ledger.ledger)
    cli.add_command(placement.placement)
    cli.add_command(top.top)
    cli.add_command(health.health)
    cli.add_command(users.user)
    cli.add_command(users.acl)


def main() -> None:
    """Console entry point: typed errors become one clear line and a non-zero exit."""
    _register_commands()
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
