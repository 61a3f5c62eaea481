"""`tide fault ...`: network and process faults on a cluster started by `tide cluster up`.

Network verbs (partition, isolate, delay, loss, heal) need a `--netns` cluster; the process
verbs (kill, pause, resume, dc-down, dc-up) work on any local cluster. DATA_DIR names the
cluster, as for `tide cluster down`.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from tidelog.cli.cluster import data_dir_option, parse_duration
from tidelog.cli.common import emit, json_option
from tidelog.drill import faults as control
from tidelog.lab import rules


@click.group("fault")
def fault() -> None:
    """Inject network and process faults into a local cluster (see `tide cluster up --netns`)."""


def _show(faults: list[str], as_json: bool) -> None:
    emit({"faults": faults}, as_json) if as_json else click.echo("\n".join(faults) or "no network faults")


@fault.command("partition")
@click.argument("a")
@click.argument("b")
@click.option("--one-way", is_flag=True, help="drop only what A sends to B")
@data_dir_option
@json_option
def partition(a: str, b: str, one_way: bool, data_dir: Path, as_json: bool) -> None:
    """Cut A from B: datacenters, processes, `controllers`, `brokers` or `client`."""
    _show(control.network(data_dir, rules.Cut(a, b, oneway=one_way)), as_json)


@fault.command("isolate")
@click.argument("what")
@click.option("--from", "frm", default=None, help="a group to cut WHAT from (default: everything else)")
@data_dir_option
@json_option
def isolate(what: str, frm: str | None, data_dir: Path, as_json: bool) -> None:
    """Cut WHAT (a datacenter or a process) from everything, or only from --from."""
    _show(control.network(data_dir, rules.Isolate(what, frm)), as_json)


@fault.command("delay")
@click.argument("a")
@click.argument("b")
@click.argument("amount")
@data_dir_option
@json_option
def delay(a: str, b: str, amount: str, data_dir: Path, as_json: bool) -> None:
    """One-way delay AMOUNT (e.g. 20ms) each way between datacenters A and B."""
    _show(control.network(data_dir, rules.Delay(a, b, parse_duration(amount) * 1000)), as_json)


@fault.command("loss")
@click.argument("a")
@click.argument("b")
@click.argument("percent")
@data_dir_option
@json_option
def loss(a: str, b: str, percent: str, data_dir: Path, as_json: bool) -> None:
    """Drop PERCENT (e.g. 30%) of the packets each way between A and B."""
    m = re.fullmatch(r"\s*(\d{1,3})\s*%?\s*", percent)
    if not m:
        raise click.BadParameter(f"{percent!r} is not a percentage like 30%")
    _show(control.network(data_dir, rules.Loss(a, b, int(m.group(1)))), as_json)


@fault.command("heal")
@data_dir_option
@json_option
def heal(data_dir: Path, as_json: bool) -> None:
    """Remove every network fault and resume paused processes (killed ones stay down: `resume` them)."""
    control.heal(data_dir)
    _show([], as_json)


@fault.command("status")
@data_dir_option
@json_option
def status(data_dir: Path, as_json: bool) -> None:
    """The network faults in force."""
    _show(control.current(data_dir), as_json)


def _process_verb(verb: str, doc: str) -> click.Command:
    @click.argument("process")
    @data_dir_option
    @json_option
    def cmd(process: str, data_dir: Path, as_json: bool) -> None:
        p = control.process(data_dir, verb, process)
        emit({"process": p["name"], "pid": p["pid"], "done": verb}, as_json)

    cmd.__doc__ = doc
    return fault.command(verb)(cmd)


_process_verb("kill", "SIGKILL PROCESS (kill -9).")
_process_verb("pause", "SIGSTOP PROCESS: it stays alive and silent.")
_process_verb("resume", "SIGCONT a paused PROCESS, or start a killed one again.")


def _datacenter_verb(verb: str, doc: str) -> click.Command:
    @click.argument("datacenter")
    @data_dir_option
    @json_option
    def cmd(datacenter: str, data_dir: Path, as_json: bool) -> None:
        names = control.datacenter(data_dir, verb, datacenter)
        emit({"killed" if verb == "down" else "started": names}, as_json)

    cmd.__doc__ = doc
    return fault.command(f"dc-{verb}")(cmd)


_datacenter_verb("down", "Kill every process of DATACENTER.")
_datacenter_verb("up", "Start again every process of DATACENTER.")
