"""`tide user create|delete|list` and `tide acl grant|revoke|list`: users and their permissions.

The calls are signed with the caller's credentials (`--access-key`/`--secret-key`,
`$TIDE_ACCESS_KEY`/`$TIDE_SECRET_KEY`), which must be a cluster admin's; an operator holding the
cluster secret (`$TIDE_CLUSTER_SECRET`, `--secret-file`, or the `--data-dir` of `tide cluster up`)
is the cluster itself and may manage users before any exists.

`tide user create NAME` draws the access key and secret here, sends the controller only the key
derived from the secret (tidelog/access.py), and prints the secret once: it cannot be shown again.
It also prints that derived key as `rocketmq_secret_key`: what RocketMQ's official clients are
given as their secret key for the RocketMQ endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from tidelog.acl import PERMISSIONS
from tidelog.cli.common import controller_call, controllers_option, emit, json_option, require_controllers
from tidelog.client.controllers import ControllerClient
from tidelog.credentials import new_credentials
from tidelog.proto import controller_pb2 as pb

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


def _secret_options(fn: F) -> F:
    fn = click.option(
        "--secret-file", default=None, type=click.Path(dir_okay=False), help="file holding the cluster secret"
    )(fn)
    return click.option(
        "--data-dir",
        default=None,
        help="a cluster started by `tide cluster up`: sign with the cluster secret of its controller.yaml",
    )(fn)


def _call(
    controllers: str,
    secret_file: str | None,
    data_dir: str | None,
    fn: Callable[[ControllerClient], Awaitable[T]],
) -> T:
    return controller_call(require_controllers(controllers), fn, secret_file=secret_file, data_dir=data_dir)


def _grant_row(g: pb.Grant) -> dict[str, str]:
    return {"user": g.user, "kind": g.kind, "resource": g.pattern, "permission": g.permission}


@click.group("user")
def user() -> None:
    """Users: an access key and a secret each (auth on: `auth: {enabled: true}`)."""


@user.command("create")
@click.argument("name")
@controllers_option
@_secret_options
@json_option
def user_create(
    name: str, controllers: str, secret_file: str | None, data_dir: str | None, as_json: bool
) -> None:
    """Create user NAME and print its access key and secret key (once: keep the secret)."""
    creds = new_credentials()

    async def go(client: ControllerClient) -> list[str]:
        return list((await client.create_user(name, creds.access_key, creds.signing_key)).not_yet_applied)

    _not_yet_on(_call(controllers, secret_file, data_dir, go))
    # RocketMQ's clients sign with the key they are given as is: they take the signing key
    # (docs/ARCHITECTURE.md §12.2), shown here so that nobody has to derive it by hand.
    doc = {
        "name": name,
        "access_key": creds.access_key,
        "secret_key": creds.secret_key,
        "rocketmq_secret_key": creds.signing_key,
    }
    emit(doc, as_json, title=f"user {name} (the secret key is shown only now)")


@user.command("delete")
@click.argument("name")
@controllers_option
@_secret_options
@json_option
def user_delete(
    name: str, controllers: str, secret_file: str | None, data_dir: str | None, as_json: bool
) -> None:
    """Delete user NAME and its grants."""

    async def go(client: ControllerClient) -> list[str]:
        return await client.delete_user(name)

    _not_yet_on(_call(controllers, secret_file, data_dir, go))
    emit({"deleted": name}, as_json, title=f"user {name}")


@user.command("list")
@controllers_option
@_secret_options
@json_option
def user_list(controllers: str, secret_file: str | None, data_dir: str | None, as_json: bool) -> None:
    """The users and their access keys."""

    async def go(client: ControllerClient) -> list[pb.User]:
        return await client.list_users()

    users = _call(controllers, secret_file, data_dir, go)
    rows = [{"name": u.name, "access_key": u.access_key} for u in users]
    emit(rows, as_json, title="users", columns=["name", "access_key"])


def _not_yet_on(brokers: list[str]) -> None:
    """Say (on stderr, so --json output stays one document) which brokers did not yet enforce the
    change when the controller answered: they will within a heartbeat or two."""
    if brokers:
        click.echo(
            f"note: not yet enforced by {', '.join(brokers)} (a broker applies it at its next heartbeat)",
            err=True,
        )


_KIND = click.Choice(sorted(PERMISSIONS))
_PERMISSION = click.Choice(sorted({p for ps in PERMISSIONS.values() for p in ps}))
_RESOURCE_HELP = "a name, '*', or a prefix ending in '*' (orders-*); the cluster's is '*'"


@click.group("acl")
def acl() -> None:
    """Permissions: topic produce|consume, group consume|admin, ledger create|write|read|fence|delete,
    cluster admin (everything)."""


def _grant_command(name: str, doc: str, revoke: bool) -> None:
    @acl.command(name, help=doc)
    @click.argument("user_name", metavar="USER")
    @click.argument("kind", type=_KIND)
    @click.argument("resource")
    @click.argument("permission", type=_PERMISSION)
    @controllers_option
    @_secret_options
    @json_option
    def command(
        user_name: str,
        kind: str,
        resource: str,
        permission: str,
        controllers: str,
        secret_file: str | None,
        data_dir: str | None,
        as_json: bool,
    ) -> None:
        async def go(client: ControllerClient) -> list[str]:
            call = client.revoke_acl if revoke else client.grant_acl
            return await call(user_name, kind, resource, permission)

        _not_yet_on(_call(controllers, secret_file, data_dir, go))
        row = {"user": user_name, "kind": kind, "resource": resource, "permission": permission}
        emit({**row, "revoked" if revoke else "granted": True}, as_json, title=name)

    command.__doc__ = doc


_grant_command(
    "grant", f"Give USER PERMISSION on the KIND resources RESOURCE names ({_RESOURCE_HELP}).", False
)
_grant_command("revoke", "Take back a grant (exactly as it was given).", True)


@acl.command("list")
@click.option("--user", "user_name", default="", help="only this user's grants")
@controllers_option
@_secret_options
@json_option
def acl_list(
    user_name: str, controllers: str, secret_file: str | None, data_dir: str | None, as_json: bool
) -> None:
    """The grants, by user."""

    async def go(client: ControllerClient) -> list[pb.Grant]:
        return await client.list_acls(user_name)

    grants = _call(controllers, secret_file, data_dir, go)
    rows = [_grant_row(g) for g in grants]
    emit(rows, as_json, title="grants", columns=["user", "kind", "resource", "permission"])
