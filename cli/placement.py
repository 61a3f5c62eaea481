"""`tide placement audit|status|repair`: is every broker set and ledger held in the datacenters it must be?

The controller leader audits placement continuously (controller RULES.md PL1-PL6); these commands
ask it for the report. `audit` exits 1 while anything violates placement, so a disaster-recovery
runbook can wait on it; `status` adds each broker set's replicas (datacenter, live, in sync) and
the recent changes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from tidelog.cli.common import (
    console,
    controller_call,
    controllers_option,
    describe_with_liveness,
    json_option,
    progress,
    quiet_option,
    require_controllers,
    secret_options,
)
from tidelog.client.controllers import ControllerClient
from tidelog.proto import controller_pb2 as pb


@click.group("placement")
def placement() -> None:
    """Audit where broker sets and ledgers are held (datacenters), after an outage or a replacement."""


def _violation(v: pb.PlacementViolation) -> dict[str, Any]:
    return {
        "kind": v.kind,
        v.kind: v.name,
        "name": v.name,
        "broker_set": v.broker_set,
        "code": v.code,
        "reason": v.reason,
        "since_s": round(v.since_ms_ago / 1000, 1),
    }


def audit_document(reply: pb.PlacementAuditReply) -> dict[str, Any]:
    """The JSON of `tide placement audit --json`: `violations` empty when all is well."""
    return {
        "violations": [_violation(v) for v in reply.violations],
        "required": {k: list(v.datacenters) for k, v in sorted(reply.required.items())},
    }


@placement.command("audit")
@controllers_option
@json_option
def audit(controllers: str, as_json: bool) -> None:
    """The violations the leader finds now; exit status 1 while there are any."""
    reply = controller_call(require_controllers(controllers), lambda c: c.placement_audit())
    doc = audit_document(reply)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    elif not doc["violations"]:
        click.echo("placement: every broker set and ledger is held where it must be")
    else:
        table = Table(title="placement violations")
        for col in ("kind", "name", "code", "for", "reason"):
            table.add_column(col)
        for v in doc["violations"]:
            table.add_row(v["kind"], v["name"], v["code"], f"{v['since_s']} s", v["reason"])
        console().print(table)
    sys.exit(1 if doc["violations"] else 0)


@placement.command("status")
@controllers_option
@json_option
def status(controllers: str, as_json: bool) -> None:
    """Each broker set's replicas by datacenter, the violations and the recent changes."""

    async def go(client: ControllerClient) -> tuple[pb.PlacementAuditReply, pb.DescribeBrokerSetsReply]:
        # The replicas' liveness is the leader's: a follower's answer to a hedged read, which
        # wins when the leader is slow, would show every replica as down.
        return await client.placement_audit(), await describe_with_liveness(client, ())

    reply, sets = controller_call(require_controllers(controllers), go)
    replicas = [
        {
            "broker_set": info.role.broker_set,
            "broker_id": m.broker_id,
            "address": m.address,
            "datacenter": m.datacenter,
            "alive": m.alive,
            "in_sync": m.in_sync,
            "master": m.is_master,
            "max_offset": m.last_max_offset,
        }
        for info in sets.broker_sets
        for m in info.members
    ]
    events = [
        {
            "ago_s": round(e.ms_ago / 1000, 1),
            "change": "opened" if e.opened else "cleared",
            **_violation(e.violation),
        }
        for e in reply.events
    ]
    repairs = [
        {
            "ago_s": round(r.ms_ago / 1000, 1),
            "broker_set": r.broker_set,
            "ledger": r.ledger,
            "replaced": {str(k): v for k, v in sorted(r.replaced.items())},
        }
        for r in reply.repairs
    ]
    doc = {**audit_document(reply), "replicas": replicas, "events": events, "repairs": repairs}
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    out = console()
    table = Table(title="replicas")
    for col in ("broker set", "id", "datacenter", "role", "live", "in sync", "max offset"):
        table.add_column(col)
    for r in replicas:
        table.add_row(
            r["broker_set"],
            str(r["broker_id"]),
            r["datacenter"] or "-",
            "master" if r["master"] else "slave",
            "yes" if r["alive"] else "[red]no[/red]",
            "yes" if r["in_sync"] else "[yellow]no[/yellow]",
            str(r["max_offset"]),
        )
    out.print(table)
    if doc["violations"]:
        for v in doc["violations"]:
            out.print(f"[red]{v['kind']} {v['name']}[/red] {v['code']} for {v['since_s']} s: {v['reason']}")
    else:
        out.print("no placement violations")
    for e in events[-20:]:
        out.print(f"{e['ago_s']} s ago: {e['kind']} {e['name']} {e['change']} {e['code']}")
    for r in repairs[-20:]:
        pairs = ", ".join(f"{k} -> {v}" for k, v in r["replaced"].items())
        out.print(f"{r['ago_s']} s ago: ledger {r['ledger']} of {r['broker_set']} re-replicated ({pairs})")


@placement.command("repair")
@click.option(
    "--max-ledgers",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="re-replicate at most this many ledgers in this call (spreads a large repair out)",
)
@controllers_option
@secret_options
@json_option
@quiet_option
def repair(max_ledgers: int, controllers: str, secret_file: str | None, data_dir: str, as_json: bool) -> None:
    """Fix what can be fixed now: ledgers naming a broker that left their set are re-replicated to
    an in-sync replica (controller RULES.md PL8). Says what is left and what fixes it; exit status
    1 while anything is left."""
    # one call, but up to --max-ledgers ensembles rewritten in it: a spinner while it runs
    with progress(f"re-replicating up to {max_ledgers} ledgers", None, as_json):
        reply = controller_call(
            require_controllers(controllers),
            lambda c: c.repair_placement(max_ledgers),
            secret_file=secret_file,
            data_dir=data_dir,
        )
    doc = {
        "repaired": [
            {
                "broker_set": r.broker_set,
                "ledger": r.ledger,
                "replaced": {str(k): v for k, v in sorted(r.replaced.items())},
            }
            for r in reply.repaired
        ],
        "violations": [_violation(v) for v in reply.remaining],
        "advice": list(reply.advice),
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for r in doc["repaired"]:
            pairs = ", ".join(f"{k} -> {v}" for k, v in r["replaced"].items())
            click.echo(f"ledger {r['ledger']} of {r['broker_set']}: replicas {pairs}")
        if not doc["repaired"]:
            click.echo("nothing to re-replicate")
        for v in doc["violations"]:
            click.echo(f"left: {v['kind']} {v['name']} {v['code']}: {v['reason']}")
        for a in doc["advice"]:
            click.echo(f"to do: {a}")
    sys.exit(1 if doc["violations"] else 0)
