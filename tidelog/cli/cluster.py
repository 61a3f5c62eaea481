"""`tide cluster up|down|status` and `tide drill ...`: a local cluster and failover drills on it."""

from __future__ import annotations

import asyncio
import os
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click

from tidelog import localcluster
from tidelog.cli.common import (
    controllers_option,
    describe_with_liveness,
    emit,
    for_command,
    json_option,
    progress,
    quiet_option,
    require_controllers,
)
from tidelog.errors import ConfigError, ControllerUnavailableError, UnavailableError
from tidelog.lab import net
from tidelog.proto import controller_pb2 as pb

DATA_DIR_ENV = "TIDE_DATA_DIR"


def data_dir_option(fn: Any) -> Any:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=lambda: os.environ.get(DATA_DIR_ENV, "tide-data"),
        show_default=f"${DATA_DIR_ENV} or ./tide-data",
        help="where the cluster keeps its data, configs, logs and pids",
    )(fn)


def topology_path(given: str) -> Path:
    """The topology file `given` names: the path itself when it exists, else the topology of that
    name packaged with tidelog (deploy/*.yaml), so `tide cluster up` works from any directory."""
    path = Path(given)
    if path.exists() or path.is_absolute() or path.parent.name not in ("deploy", ""):
        return path
    packaged = Path(str(resources.files("tidelog.deploy").joinpath(path.name)))
    return packaged if packaged.is_file() else path


@click.group("cluster")
def cluster() -> None:
    """Run a local cluster from a topology file."""


@cluster.command("up")
@click.option(
    "-c",
    "--config",
    "config_path",
    default="deploy/local.yaml",
    show_default=True,
    help="topology file; a deploy/ topology not found from here is read from the installed package",
)
@data_dir_option
@click.option("--wait", type=float, default=60.0, show_default=True, help="seconds to wait for masters")
@click.option(
    "--netns",
    is_flag=True,
    help="each process in its own network namespace, grouped by datacenter, behind a router that "
    "applies `tide fault` and the WAN delay (needs root, ip and nft)",
)
@click.option(
    "--wan-delay",
    default=None,
    help="one-way delay between datacenters with --netns, e.g. 5ms "
    "(default: the topology's lab.wan_delay_ms, else 0)",
)
@json_option
@quiet_option
def up(
    config_path: str, data_dir: Path, wait: float, netns: bool, wan_delay: str | None, as_json: bool
) -> None:
    """Start every process of the topology in the background; return once each broker set has a master."""
    topo = localcluster.load_topology(topology_path(config_path))
    delay_ms = None if wan_delay is None else parse_duration(wan_delay) * 1000
    if delay_ms is not None and not netns:
        raise click.UsageError("--wan-delay needs --netns")
    with progress("starting", localcluster.process_count(topo) + 1, as_json) as step:
        state = localcluster.up(
            topo,
            data_dir,
            wait_s=wait,
            netns=netns,
            wan_delay_ms=delay_ms,
            on_step=lambda what: step(description=what),
        )
    cols = ("name", "kind", "pid", "address", "metrics", "datacenter", "netns", "log")
    if as_json:
        emit(
            {
                "controllers": state["controllers"],
                # controllers and brokers: works as --controllers / $TIDE_CONTROLLERS while no
                # controller answers too
                "bootstrap": localcluster.bootstrap(state),
                "data_dir": state["data_dir"],
                "client_netns": state.get("client_netns"),
                "processes": [{k: p.get(k) for k in cols} for p in state["processes"]],
                # with TLS: the CA clients verify with, and a client pair for mutual TLS
                **{k: state[k] for k in ("ca_file", "cert_file", "key_file") if state.get(k)},
                # with auth: the admin user `up` created (also in the state file and `exec`'s environment)
                **({"credentials": state["credentials"]} if state.get("credentials") else {}),
            },
            True,
        )
        return
    emit(
        [{k: p.get(k) for k in cols} for p in state["processes"]],
        False,
        title=f"cluster up in {state['data_dir']}",
        columns=[c for c in cols if netns or c != "netns"],
    )
    for name, value in localcluster.client_env(state).items():
        click.echo(f"export {name}={value}")
    click.echo(
        "# with the brokers too, commands and clients keep working while no controller answers:\n"
        f"# export TIDE_CONTROLLERS={','.join(localcluster.bootstrap(state))}"
    )
    if state.get("client_netns"):
        click.echo(
            "# the processes are reachable from the lab's client side: tide cluster exec -- tide cluster status"
        )


@cluster.command("wait-masters", hidden=True)
@controllers_option
@click.option("--wait", type=float, default=60.0)
@click.argument("broker_sets", nargs=-1, required=True)
def wait_masters(controllers: str, wait: float, broker_sets: tuple[str, ...]) -> None:
    """Return once every named broker set has a master (used by `up --netns` from the client side)."""
    asyncio.run(localcluster.wait_masters(require_controllers(controllers), list(broker_sets), [], wait))


@cluster.command("exec", context_settings={"ignore_unknown_options": True})
@data_dir_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def exec_(data_dir: Path, command: tuple[str, ...]) -> None:
    """Run COMMAND on the client side of a --netns cluster, with TIDE_CONTROLLERS (and TIDE_CA_FILE) set
    (`tide cluster exec -- tide cluster status`)."""
    state = localcluster.read_state(data_dir.resolve())
    ns = state.get("client_netns")
    env = {**os.environ, **localcluster.client_env(state), DATA_DIR_ENV: str(data_dir.resolve())}
    prefix = net.on_client_side(ns) if ns else []
    os.execvpe(([*prefix, *command])[0], [*prefix, *command], env)


@cluster.command("down")
@data_dir_option
@json_option
def down(data_dir: Path, as_json: bool) -> None:
    """Stop exactly the processes that `tide cluster up` started in DATA_DIR."""
    stopped = localcluster.down(data_dir)
    emit({"stopped": stopped}, as_json, title="cluster down")


@cluster.command("restart")
@click.argument("name")
@data_dir_option
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="seconds to wait until it serves again (its /readyz answers 200)",
)
@click.option("--no-wait", is_flag=True, help="return once it is started, serving or not")
@json_option
@quiet_option
def restart(name: str, data_dir: Path, wait_s: float, no_wait: bool, as_json: bool) -> None:
    """Restart process NAME of the cluster (a name from `tide cluster up`'s table, e.g. broker-a-0
    or controller-c1): stopped with SIGTERM if it runs, then started again with the same config,
    and waited for until it serves (--no-wait: not). `tide cluster down` stops it like the others."""
    data_dir = data_dir.resolve()
    procs = localcluster.read_state(data_dir)["processes"]
    proc = next((p for p in procs if p["name"] == name), None)
    if proc is None:
        raise ConfigError(
            f"no process named {name!r} in {data_dir}", hint=f"one of: {', '.join(p['name'] for p in procs)}"
        )
    was_running = localcluster.is_running(proc)
    if was_running:
        localcluster.stop_process(proc["pid"], args=proc["args"])
    started = localcluster.restart(data_dir, name)
    if not no_wait:
        _wait_serving(started, wait_s, as_json)
    emit(
        {
            "name": name,
            "pid": started["pid"],
            "was_running": was_running,
            "serving": None if no_wait else True,
            "log": started["log"],
        },
        as_json,
        title="restarted",
    )


def _wait_serving(proc: dict[str, Any], wait_s: float, as_json: bool) -> None:
    """Until the restarted process answers /readyz with 200 on its metrics address (a broker once
    registered with its role, a controller once its Raft group has a leader): a restart that
    returned at once left `cluster status` showing the broker unreachable."""
    from tidelog.cli import health

    if not proc.get("metrics") or proc.get("netns"):
        return  # no health endpoint this side can reach: started is all that can be told
    deadline = time.monotonic() + wait_s
    answer = None
    with progress(f"waiting for {proc['name']} to serve", None, as_json):
        while time.monotonic() < deadline:
            if not localcluster.is_running(proc):
                raise UnavailableError(
                    f"{proc['name']} exited while starting", hint=f"see its log, {proc['log']}"
                )
            answer = health.ask(proc["metrics"], "/readyz")
            if answer.ready:
                return
            time.sleep(health.POLL_S)
    why = answer.reason if answer is not None else "not asked"
    raise UnavailableError(
        f"{proc['name']} runs but did not serve within {wait_s:g} s ({why})",
        hint=f"see its log, {proc['log']}; or pass --no-wait",
    )


async def _describe(c: Any) -> Any:
    """The broker sets, from a controller (with liveness when one can give it) or, while none
    answers, from a broker's view."""
    try:
        reply = await c.describe_broker_sets()
    except ControllerUnavailableError as exc:
        if c.brokers:
            raise
        # no broker to ask instead: say how to get the brokers' own view
        raise ControllerUnavailableError(
            exc.message,
            hint="give a broker's address too (--controllers takes both; `tide cluster up` prints "
            "the bootstrap list) to see each broker's own view",
        ) from None
    if reply.from_broker:
        # a controller slower than the hedge delay is not an absent one: ask each once more, with
        # time to answer, before saying they are unreachable
        request = pb.DescribeBrokerSetsRequest()
        answers = await asyncio.gather(
            *(
                c.call("route", "DescribeBrokerSets", request, address=address, timeout=2.0)
                for address in c.addresses
                if address not in c.brokers
            ),
            return_exceptions=True,
        )
        reply = next((a for a in answers if not isinstance(a, BaseException) and not a.from_broker), reply)
    if not reply.from_broker and not reply.liveness_known:
        reply = await describe_with_liveness(c, ())
    return reply


async def _member_row(client: Any, m: Any, liveness_known: bool, reachable: bool) -> dict[str, Any]:
    """One member as the broker set's description names it, with what the broker itself says."""
    from tidelog.proto import broker_pb2 as bpb

    row: dict[str, Any] = {
        "broker_id": m.broker_id,
        "address": m.address,
        "role": "unreachable",
        "max_offset": None,
        "confirm_offset": None,
        "in_sync": m.in_sync,
        "datacenter": m.datacenter,
        "alive": m.alive if liveness_known else None,
        # where the official RocketMQ clients connect (broker/rocketmq.py); None: off
        "rocketmq_endpoint": None,
    }
    try:
        s = await client.call_broker(m.address, "Status", bpb.StatusRequest(), timeout=2.0)
    except Exception:
        return row
    if s.broker_id != m.broker_id:
        # its address now serves another broker (a wiped replica back under a new id): this id is
        # gone, not a live slave
        row["role"] = f"gone (broker {s.broker_id} answers here)"
        return row
    row.update(
        role=s.role,
        max_offset=s.max_offset,
        confirm_offset=s.confirm_offset,
        epoch=s.last_epoch,
        rocketmq_endpoint=s.rocketmq_address or None,
        # its own view: what its last heartbeat reply said
        master_epoch=s.master_epoch,
        sync_state_set=list(s.sync_state_set),
        controller_heard_ms_ago=s.controller_heard_ms_ago,
    )
    if not reachable:
        row["in_sync"] = s.role == "master" or m.broker_id in s.sync_state_set
    return row


async def _status(controllers: str) -> dict[str, Any]:
    """The cluster's broker sets with each member's own Status. While no controller answers (a
    broker's route view answered instead), every row is what that broker itself says: its role,
    epoch and SyncStateSet as its last heartbeat reply gave them, and its offsets."""
    from tidelog.client.aio import AsyncClient

    async with AsyncClient(controllers) as client:
        reply = await _describe(for_command(client.controller))
        reachable = not reply.from_broker
        out = []
        for b in reply.broker_sets:
            role = b.role
            members = [await _member_row(client, m, reply.liveness_known, reachable) for m in b.members]
            master_max = next(
                (r["max_offset"] for r in members if role.has_master and r["broker_id"] == role.master_id),
                None,
            )
            for row in members:
                row["lag"] = (
                    None
                    if master_max is None or row["max_offset"] is None
                    else master_max - row["max_offset"]
                )
            masters = [r for r in members if r["role"] == "master"]
            own = masters[0] if not reachable and masters else None
            out.append(
                {
                    "name": role.broker_set,
                    "master": own["broker_id"] if own else (role.master_id if role.has_master else None),
                    "epoch": own["master_epoch"] if own else role.master_epoch,
                    "sync_state_set": own["sync_state_set"] if own else list(role.sync_state_set),
                    "sync_state_set_epoch": role.sync_state_set_epoch,
                    "members": members,
                }
            )
        controllers_view: dict[str, Any] = {"reachable": reachable}
        if not reachable:
            controllers_view["view_age_ms"] = int(reply.metadata_age_ms)
        return {"controllers": controllers_view, "broker_sets": out}


@cluster.command("status")
@controllers_option
@json_option
def status(controllers: str, as_json: bool) -> None:
    """Broker sets, members, master, epoch, SyncStateSet, offsets and replica lag. While no
    controller answers (give a broker's address too: `--controllers` takes both), it says so and
    shows each broker's own view."""
    doc = asyncio.run(_status(require_controllers(controllers)))
    sets = doc["broker_sets"]
    if as_json:
        emit(doc, True)
        return
    if not doc["controllers"]["reachable"]:
        click.echo(
            "controllers unreachable: each broker's own view below (the brokers last heard from a "
            f"controller {doc['controllers']['view_age_ms'] / 1000:.1f} s ago); elections, topic and "
            "ledger changes wait for them",
            err=True,
        )
    rows = []
    for s in sets:
        for m in s["members"]:
            rows.append(
                {
                    "broker_set": s["name"],
                    "broker": m["broker_id"],
                    "address": m["address"],
                    "datacenter": m["datacenter"] or "-",
                    "role": m["role"],
                    "epoch": s["epoch"] if doc["controllers"]["reachable"] else m.get("master_epoch"),
                    "in_sync": "yes" if m["in_sync"] else "no",
                    "max_offset": m["max_offset"],
                    "confirm_offset": m["confirm_offset"],
                    "lag": m["lag"],
                }
            )
    emit(
        rows,
        False,
        title="cluster status",
        columns=[
            "broker_set",
            "broker",
            "address",
            "datacenter",
            "role",
            "epoch",
            "in_sync",
            "max_offset",
            "confirm_offset",
            "lag",
        ],
    )


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 500ms or 2m")
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "ms" else value * 60 if m.group(2) == "m" else value


@click.group("drill")
def drill() -> None:
    """Failover drills on a cluster started with `tide cluster up`."""


@drill.command("kill-master")
@click.argument("broker_set")
@click.option("--duration", default="30s", show_default=True, help="how long to produce (e.g. 30s)")
@click.option("--keep-topic", is_flag=True, help="keep the drill's topic (deleted once checked by default)")
@data_dir_option
@json_option
def kill_master(broker_set: str, duration: str, keep_topic: bool, data_dir: Path, as_json: bool) -> None:
    """Produce with sync replication, SIGKILL BROKER_SET's master, verify every acknowledged message."""
    from tidelog.drill.killmaster import kill_master as run

    seconds = parse_duration(duration)
    with progress(f"drill: kill the master of {broker_set}", None, as_json) as step:
        report = run(data_dir, broker_set, seconds, on_event=_noter(step, as_json), keep_topic=keep_topic)
    emit(report, as_json, title=f"drill: kill the master of {broker_set}")
    if report["acked_lost"]:
        raise click.ClickException(f"{report['acked_lost']} acknowledged messages were lost")


def _noter(step: Any, as_json: bool) -> Any:
    """A drill's event: a line of output, and the progress bar's description (terminal only)."""
    if as_json:
        return None

    def note(msg: str) -> None:
        click.echo(f"  {msg}")
        step(0, description=msg.strip())

    return note


def _drill_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(report, True)
    else:
        emit(
            {k: v for k, v in report.items() if k not in ("steps", "split_brain_detail")},
            False,
            title=f"drill: {report['scenario']}",
        )
    problems = []
    if report["acked_lost"]:
        problems.append(f"{report['acked_lost']} acknowledged messages were lost")
    if report["split_brain"]:
        problems.append("two masters acknowledged writes in overlapping time")
    if not report["replicas_identical"]:
        problems.append(f"replicas differ: {report['replicas_detail']}")
    if problems:
        raise click.ClickException("; ".join(problems))


def _run_drill(data_dir: Path, as_json: bool, argv: list[str], **kw: Any) -> None:
    from tidelog.drill import quorum
    from tidelog.drill import scenarios as drills

    prefix = drills.inside_client_netns(data_dir)
    if prefix is not None:  # a --netns cluster is reached from its client side only
        import subprocess
        import sys

        proc = subprocess.run([*prefix, sys.executable, "-m", "tidelog.cli", *argv], check=False)
        raise SystemExit(proc.returncode)
    with progress("drill", None, as_json) as step:
        runner = quorum.run if kw.get("scenario") in quorum.SCENARIOS else drills.run
        report = runner(data_dir, note=_noter(step, as_json), **kw)
    _drill_report(report, as_json)


def _pace_options(fn: Any) -> Any:
    """How long the producer runs before the first fault and after the heal, and how long each
    fault lasts (the drill's pace)."""
    fn = click.option(
        "--hold",
        type=click.FloatRange(0.05, 10),
        default=1.0,
        show_default=True,
        help="scale every fault's duration by this factor (the drills assume liveness timeouts of "
        "3 s for the controller and 5 s for HA idle: halve them, halve this)",
    )(fn)
    fn = click.option(
        "--settle",
        type=click.FloatRange(0, 600),
        default=4.0,
        show_default=True,
        help="seconds of producing after the heal, before the check",
    )(fn)
    return click.option(
        "--warmup",
        type=click.FloatRange(0, 600),
        default=3.0,
        show_default=True,
        help="seconds of producing before the first fault",
    )(fn)


def _pace_argv(warmup: float, settle: float, hold: float) -> list[str]:
    return ["--warmup", str(warmup), "--settle", str(settle), "--hold", str(hold)]


@drill.command("run")
@click.argument("scenario")
@click.option(
    "--broker-set", default=None, help="the broker set to drill (default: the first of 2+ replicas)"
)
@click.option("--keep-topic", is_flag=True, help="keep the drill's topic (deleted once checked by default)")
@_pace_options
@data_dir_option
@json_option
def drill_run(
    scenario: str,
    broker_set: str | None,
    keep_topic: bool,
    warmup: float,
    settle: float,
    hold: float,
    data_dir: Path,
    as_json: bool,
) -> None:
    """Run a named SCENARIO under a sync-replicated producer, heal, and check (see `tide drill list`)."""
    argv = (
        ["drill", "run", scenario, "--data-dir", str(data_dir.resolve())]
        + (["--json"] if as_json else [])
        + (["--broker-set", broker_set] if broker_set else [])
        + (["--keep-topic"] if keep_topic else [])
        + _pace_argv(warmup, settle, hold)
    )
    _run_drill(
        data_dir,
        as_json,
        argv,
        scenario=scenario,
        broker_set=broker_set,
        keep_topic=keep_topic,
        warmup_s=warmup,
        settle_s=settle,
        hold_scale=hold,
    )


@drill.command("random")
@click.option("--seed", type=int, required=True)
@click.option("--steps", type=click.IntRange(1, 1000), default=5, show_default=True)
@click.option("--broker-set", default=None)
@click.option("--keep-topic", is_flag=True, help="keep the drill's topic (deleted once checked by default)")
@_pace_options
@data_dir_option
@json_option
def drill_random(
    seed: int,
    steps: int,
    broker_set: str | None,
    keep_topic: bool,
    warmup: float,
    settle: float,
    hold: float,
    data_dir: Path,
    as_json: bool,
) -> None:
    """A seeded schedule of STEPS faults (each held 1-5 s, then healed), then the check."""
    argv = (
        ["drill", "random", "--seed", str(seed), "--steps", str(steps), "--data-dir", str(data_dir.resolve())]
        + (["--json"] if as_json else [])
        + (["--broker-set", broker_set] if broker_set else [])
        + (["--keep-topic"] if keep_topic else [])
        + _pace_argv(warmup, settle, hold)
    )
    _run_drill(
        data_dir,
        as_json,
        argv,
        seed=seed,
        steps=steps,
        broker_set=broker_set,
        keep_topic=keep_topic,
        warmup_s=warmup,
        settle_s=settle,
        hold_scale=hold,
    )


@drill.command("list")
@json_option
def drill_list(as_json: bool) -> None:
    """The named scenarios."""
    from tidelog.drill.quorum import SCENARIOS as QUORUM
    from tidelog.drill.scenarios import SCENARIOS

    emit(
        [{"scenario": k, "needs_netns": v[1], "what": v[2]} for k, v in SCENARIOS.items()]
        + [{"scenario": k, "needs_netns": True, "what": v[1]} for k, v in QUORUM.items()],
        as_json,
        title="drill scenarios",
    )
